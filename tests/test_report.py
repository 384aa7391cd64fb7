"""report.py: the HTML report from synthetic records (fast), then from real episodes with screenshots,
rendered in headless Chromium."""
import base64
import io
import json
import os
import re

import pytest

import browser
import env as webenv
import experts
import policy
import report
import runlog
import generators
from rollout import EnvPool, rollout

HOSTILE = "<script>alert(1)</script>"


def _jpeg_b64() -> str:
    """A tiny JPEG, base64, as rollout.py stores screenshots."""
    from PIL import Image  # (matplotlib's dependency)

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), "yellow").save(buf, "JPEG")
    return base64.b64encode(buf.getvalue()).decode()


JPEG = _jpeg_b64()


def _turn(obs, response, action=None, error="", **kw):
    return {"prompt_ids": [1], "response_ids": [2], "response_logprobs": [-0.1], "observation": obs,
            "response": response, "action": action, "error": error, "truncated": False, **kw}


def _synthetic():
    page = "Goal: Click on the OK button.\nURL: miniwob/click-button.html\n[13] button 'OK'\n[14] button 'No'"
    return [
        {"task": "click-button", "seed": 1, "goal": "Click OK", "source": "real", "reward": 1.0, "success": True,
         "env_error": False, "steps": 1, "turns": [_turn(page, "click('13')", "click('13')", screenshot=JPEG)],
         "final_screenshot": JPEG},
        {"task": "click-button", "seed": 2, "goal": "Click OK", "source": "real", "reward": 0.0, "success": False,
         "env_error": False, "steps": 2,
         "turns": [_turn(page + "\n[15] generic " + repr(HOSTILE), f"I will {HOSTILE}", None,
                         f"ActionParseError: no action in {HOSTILE}"),
                   _turn(page, "click('14')", "click('14')")]},
        {"task": "enter-text", "seed": 3, "goal": "Type", "source": "real", "reward": 0.0, "success": False,
         "env_error": True, "steps": 0, "turns": [], "error": "reset failed: boom"},
        {"task": "click-link", "seed": 4, "goal": "Click link", "source": "dream", "reward": 1.0, "success": True,
         "env_error": False, "steps": 1, "predicted_success": True, "real_success": False,
         "turns": [_turn("Goal: x\n[5] link 'a'\n[6] link 'b'", "click('5')", "click('5')",
                         real_observation="Goal: x\n[5] link 'a'\n[7] link 'c'")]},
        {"task": "click-link", "seed": 5, "goal": "Click link", "source": "dream", "reward": 0.0, "success": False,
         "env_error": False, "steps": 1, "turns": [_turn("Goal: y", "click('9')", "click('9')", real_observation=None)]},
    ]


def _sections(html_text):
    return re.findall(r"<section class='episode (\w+)'[^>]*data-source='(\w+)'", html_text)


def test_report_from_synthetic_records(tmp_path):
    trajs = _synthetic()
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "time": 0.0, "loss/policy": 1.0 / s, "rollout/success": s / 10})
                               + "\n" for s in range(1, 6)) + "not json\n")
    path = report.write_report(str(tmp_path / "rep"), trajs, metrics_path=str(metrics), title=f"t {HOSTILE}")
    text = open(path, encoding="utf-8").read()
    secs = _sections(text)
    assert len(secs) == 5
    kinds = [k for k, _ in secs]
    assert kinds == ["fail", "fail", "env_error", "success", "success"]  # failures first
    assert HOSTILE not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<script" not in text.lower()  # nothing executable anywhere
    assert "http://" not in text and "https://" not in text  # self-contained
    assert text.count(f"data:image/jpeg;base64,{JPEG}") == 2  # one step, one final page
    assert text.count("data:image/png;base64,") == 2  # the two curves, embedded
    assert sorted(os.listdir(tmp_path / "rep")) == ["curve_loss_policy.png", "curve_rollout_success.png", "report.html"]
    # dream: imagined vs real, the differing line highlighted, predicted vs real success
    assert "imagined vs real (1 line differs)" in text and "<td class='chg'>[6] link &#x27;b&#x27;</td>" in text
    assert "predicted success <b>yes</b> / real replay success <b>no</b> (<b>disagree</b>)" in text
    assert "imagined observation (no real replay)" in text
    assert "source: real" in text and "source: dream" in text  # one table per source
    # the cap keeps failures first and spreads over tasks
    shown = report.select_episodes(trajs, 3)
    assert [(t["task"], t["seed"]) for t in shown] == [("click-button", 2), ("click-link", 5), ("enter-text", 3)]
    assert len(_sections(open(report.write_report(str(tmp_path / "r2"), trajs, max_episodes=2)).read())) == 2


BROKEN = "caf\udce9 \ud83d"  # lone surrogates: text a page's broken UTF-16 or a model's reply can hold


def test_files_written_survive_any_text(tmp_path, capsys):
    # a goal, a reply, an action, an error and a page holding lone surrogates: the report, the
    # trajectories, the metrics log and eval.py --report's files are written, as valid UTF-8 with U+FFFD
    t = _synthetic()[1]
    t = dict(t, goal=f"Click {BROKEN}", error=BROKEN,
             turns=[_turn(f"Goal: {BROKEN}\n[13] button '{BROKEN}'", f"<think>{BROKEN}</think>click('13')",
                          f"click('{BROKEN}')", f"ValueError: {BROKEN}")])
    path = report.write_report(str(tmp_path / "rep"), [t], title=f"run {BROKEN}")
    text = open(path, encoding="utf-8").read()  # strict UTF-8: raises on anything the writer let through
    assert "caf\ufffd" in text and "\udce9" not in text
    runlog.write_jsonl(str(tmp_path / "trajectories.jsonl"), [t])
    assert runlog.read_jsonl(str(tmp_path / "trajectories.jsonl"))[0]["goal"] == t["goal"]  # JSON keeps the text
    with runlog.open_text(str(tmp_path / "results.md")) as f:
        f.write(f"| {BROKEN} |\n")
    assert open(tmp_path / "results.md", encoding="utf-8").read() == "| caf\ufffd \ufffd |\n"
    # the report command on those trajectories (what eval.py --report and report.py do)
    report.main([str(tmp_path / "trajectories.jsonl"), "--out", str(tmp_path / "rep2"), "--title", BROKEN])
    assert "caf\ufffd" in open(tmp_path / "rep2" / "report.html", encoding="utf-8").read()


def test_every_text_file_is_written_through_open_text():
    # the kind, not the one file: a module that writes a text file with plain open() (or pathlib's open or
    # write_text) would raise on the first lone surrogate. Read with ast: every open() whose mode is not a
    # literal binary or read mode, outside runlog.open_text itself, is listed (binary "wb" and reads are fine)
    import ast

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = []
    for dirpath, _, names in os.walk(root):
        if any(part.startswith(".") or part in ("tests", "runs", "__pycache__") for part in dirpath[len(root):].split(os.sep)):
            continue
        for name in (n for n in names if n.endswith(".py")):
            tree = ast.parse(open(os.path.join(dirpath, name), encoding="utf-8").read())
            inside = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "open_text"
                      for n in ast.walk(f)}
            for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and id(n) not in inside):
                fn = call.func
                fname = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                if fname == "write_text":
                    found.append(f"{name}:{call.lineno} write_text")
                if fname != "open" or (isinstance(fn, ast.Attribute) and not call.args and not call.keywords):
                    continue
                builtin = isinstance(fn, ast.Name) or getattr(fn.value, "id", "") in ("io", "codecs")
                args = call.args[1:] if builtin else call.args  # open(path, mode) / path.open(mode)
                mode = next((k.value for k in call.keywords if k.arg == "mode"), args[0] if args else None)
                if not builtin and not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)):
                    continue  # another object's open() (a urllib opener, a tarfile): only pathlib's takes a mode string
                if mode is None or (isinstance(mode, ast.Constant) and ("b" in mode.value or set(mode.value) <= set("rt"))):
                    continue
                found.append(f"{name}:{call.lineno} open(..., {ast.unparse(mode)})")
    assert found == []


def _open_in_chromium(html_path, png_path):
    """Load the report in headless Chromium: (episode sections, [(complete, naturalWidth)] of every img,
    console errors); saves a screenshot of the page to png_path."""
    chromium = browser.thread_playwright().chromium.launch(executable_path=browser.chromium_path(),
                                                           args=browser.CHROMIUM_ARGS)
    try:
        page = chromium.new_page(viewport={"width": 1200, "height": 900})
        errors = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: errors.append(f"request {r.url}") if not r.url.startswith(("file:", "data:")) else None)
        page.goto("file://" + os.path.abspath(html_path), wait_until="load")
        n = page.locator("section.episode").count()
        imgs = page.eval_on_selector_all("img", "els => els.map(e => [e.complete, e.naturalWidth])")
        page.screenshot(path=png_path)
        return n, imgs, errors
    finally:
        chromium.close()


def test_report_of_real_episodes_renders(tmp_path):
    tok = policy.load_tokenizer()
    model = policy.tiny_model(tok)
    # two episodes through rollout.py (a random tiny model: failures), screenshots on
    workers = EnvPool(lambda task: webenv.WebEnv(task, max_steps=2, screenshots=True), tok, num_envs=1)
    try:
        trajs, _ = rollout(generators.HFGenerator(model, tok), tok, workers, [("click-button", 10_000), ("click-button", 10_001)], max_new_tokens=6)
    finally:
        workers.close()
    for t in trajs:
        assert not t["env_error"] and t["steps"] >= 1
        assert all(base64.b64decode(u["screenshot"])[:2] == b"\xff\xd8" for u in t["turns"])  # JPEG
        assert base64.b64decode(t["final_screenshot"])[:2] == b"\xff\xd8"
        json.dumps(t)  # still a JSON record
    # one expert episode by hand (a success), with the same record shape
    e = webenv.WebEnv("click-button", screenshots=True)
    try:
        obs = e.reset(10_002)
        assert obs.screenshot and len(obs.screenshot) > 500 and "screenshot" not in obs.text
        action = experts.expert_action("click-button", obs)
        nxt, reward, done, info = e.step(action)
    finally:
        e.close()
    assert done and reward == 1.0 and nxt.screenshot
    b64 = lambda b: base64.b64encode(b).decode()
    trajs.append({"task": "click-button", "seed": 10_002, "goal": obs.goal, "source": "expert", "reward": reward,
                  "success": True, "env_error": False, "steps": 1, "final_screenshot": b64(nxt.screenshot),
                  "turns": [_turn(obs.text, action, info["action"], info["error"], screenshot=b64(obs.screenshot))]})
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "loss/bc": 2.0 / s}) + "\n" for s in range(1, 4)))
    path = report.write_report(str(tmp_path / "rep"), trajs, metrics_path=str(metrics), title="real episodes")
    assert os.path.getsize(path) < 1_000_000
    png = str(tmp_path / "report.png")
    n, imgs, errors = _open_in_chromium(path, png)
    assert n == 3 and not errors
    n_shots = sum(len(t["turns"]) + 1 for t in trajs)
    assert len(imgs) == n_shots + 1 and all(c and w > 0 for c, w in imgs), imgs  # + the loss/bc curve
    assert os.path.getsize(png) > 1000
