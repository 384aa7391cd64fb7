"""env.py: tasks, seeds and reward (pure), the request filter, then real episodes in headless Chromium
(one browser per task, reused by every test of the module). The action grammar: test_actions.py."""
import os

import pytest

import browser
import env
import watchdog
from axtree import read_tree

# ---------------------------------------------------------------------------------------------
# Tasks, seeds, reward


def test_success_is_full_credit_only():
    # MiniWoB pays partial credit for some wrong answers (raw reward in (0, 1)): not a success
    assert env.is_success(1.0)
    assert not env.is_success(0.5)
    assert not env.is_success(0.02)
    assert not env.is_success(0.0)
    assert not env.is_success(-1.0)


def test_seeds_disjoint():
    assert set(env.TRAIN_SEEDS).isdisjoint(env.EVAL_SEEDS)
    assert set(env.train_seeds(50, offset=9_990)).isdisjoint(env.eval_seeds(1000))
    assert env.eval_seeds(3) == env.eval_seeds(3) == [10_000, 10_001, 10_002]
    assert len(env.SUITE) >= 12 and all(t in env.TASKS for t in env.SUITE)


def test_unknown_task():
    with pytest.raises(ValueError, match="click-button"):
        env.make_env("no-such-task")


def test_url_allowed():
    assert browser.url_allowed(os.environ["MINIWOB_URL"] + "click-button.html")
    assert browser.url_allowed("about:blank")
    assert not browser.url_allowed("file:///etc/passwd")
    assert not browser.url_allowed("file://" + browser.MINIWOB_HTML_DIR + "/../../../../etc/passwd")
    assert not browser.url_allowed("file://" + browser.MINIWOB_HTML_DIR + "-evil/x.html")
    assert not browser.url_allowed("http://example.com/")
    assert not browser.url_allowed("https://localhost:8080/")


# ---------------------------------------------------------------------------------------------
# Real Chromium


@pytest.fixture(scope="module")
def envs():
    made = {}

    def get(task):
        if task not in made:
            made[task] = env.make_env(task, max_steps=3)
        return made[task]

    yield get
    for e in made.values():
        e.close()


def _bid(obs, role, name=None):
    """The bid of the first node with this role (and name, when given)."""
    for n in read_tree(obs.axtree):
        if n.bid is not None and n.role == role and name in (None, n.name):
            return n.bid
    raise AssertionError(f"no {role} {name!r} in\n{obs.axtree}")


def test_click_button_episode(envs):
    e = envs("click-button")
    obs = e.reset(env.eval_seeds(1)[0])
    assert obs.goal.startswith("Click on the") and obs.step == 0 and obs.error == ""
    assert obs.text.startswith(f"Goal: {obs.goal}\nURL: miniwob/click-button.html\n")
    assert "InlineTextBox" not in obs.text and "] button '" in obs.axtree
    label = obs.goal.split('"')[1]
    obs, reward, done, info = e.step(f"<think>the {label} button</think>click('{_bid(obs, 'button', label)}')")
    assert (reward, done, info["success"], info["env_error"], info["raw_reward"]) == (1.0, True, True, False, 1.0)
    assert info["action"].startswith("click('")


def test_wrong_answer_is_not_success(envs):
    e = envs("click-button")
    for seed in env.eval_seeds(20):  # a page with a button other than the one asked for
        obs = e.reset(seed)
        label = obs.goal.split('"')[1]
        wrong = [n.bid for n in read_tree(obs.axtree) if n.bid and n.role == "button" and n.name != label]
        if wrong:
            break
    obs, reward, done, info = e.step(f"click('{wrong[0]}')")
    assert done and reward == 0.0 and not info["success"] and info["raw_reward"] < 1


def test_link_spans_have_bids(envs):
    e = envs("click-link")
    obs = e.reset(env.eval_seeds(2)[1])
    word = obs.goal.split('"')[1]
    obs, reward, done, info = e.step(f"click('{_bid(obs, 'generic', word)}')")
    assert info["success"] and reward == 1.0


def test_hidden_content_is_read_for_the_world_model_only(envs):
    """WebEnv(hidden=True): the closed tabs' text is in Obs.hidden with the bids it will have in the tree,
    which shows it word for word once its tab is opened; Obs.text (the policy's) never holds it, and a
    plain WebEnv reads none."""
    seed = env.eval_seeds(1)[0]
    e = env.make_env("click-tab-2", max_steps=3, hidden=True)
    try:
        for seed in env.eval_seeds(10):  # a page whose second tab has words in <span>s: `[31] generic 'molestie.'`
            obs = e.reset(seed)
            hidden = obs.hidden.split("\n")
            assert hidden[0].startswith("[") and " tabpanel" in hidden[0]
            assert not any(line.strip() in obs.text for line in hidden)
            end = next((i for i in range(1, len(hidden)) if not hidden[i].startswith(" ")), len(hidden))
            with_bid = [line.strip() for line in hidden[1:end] if line.strip().startswith("[") and "'" in line]
            if with_bid:  # in the panel of Tab #2, the first one hidden
                break
        assert with_bid
        obs, _, _, info = e.step(f"click('{_bid(obs, 'link', 'Tab #2')}')")
        assert not info["env_error"]
        tree = {line.strip() for line in obs.axtree.split("\n")}
        assert with_bid[0] in tree  # same bid, role and name as the tree writes it
    finally:
        e.close()
    plain = envs("click-tab-2")
    assert plain.reset(seed).hidden == ""
    plain.hidden = True  # settable between episodes (EnvPool.set_env_attr("hidden", True))
    try:
        assert plain.reset(seed).hidden.startswith("[")
        # a page whose scripts break HIDDEN_JS costs the hidden lines, not the step
        plain._bg.page.evaluate("() => { Element.prototype.getClientRects = () => { throw new Error('no'); }; }")
        obs, _, _, info = plain.step("noop()")
        assert not info["env_error"] and obs.hidden == "" and "tab" in obs.axtree
    finally:
        plain.hidden = False


def test_fill_then_submit_and_parse_error_continues(envs):
    e = envs("enter-text")
    obs = e.reset(env.eval_seeds(1)[0])
    text = obs.goal.split('"')[1]
    box = _bid(obs, "textbox")
    obs, reward, done, info = e.step("I should type the name")  # no action: a step, nothing runs
    assert not done and reward == 0.0 and info["action"] is None and obs.step == 1
    assert "no action found" in obs.error and "Last action error: ActionParseError" in obs.text
    obs, reward, done, info = e.step(f"fill('{box}', {text!r})")
    assert not done and obs.error == "" and f"value={text!r}" in obs.axtree
    obs, reward, done, info = e.step(f"click('{_bid(obs, 'button', 'Submit')}')")
    assert done and info["success"] and reward == 1.0


def test_bad_bid_error_and_step_limit(envs):
    e = envs("click-dialog")
    e.reset(env.eval_seeds(1)[0])
    obs, reward, done, info = e.step("click('9999')")
    assert "9999" in obs.error and not done and not info["env_error"]
    obs, reward, done, info = e.step("noop()")
    assert not done
    obs, reward, done, info = e.step("noop()")  # max_steps=3: truncated, reward 0
    assert done and info["truncated"] and reward == 0.0 and not info["success"]


def test_navigation_blocked(envs):
    e = envs("click-dialog")
    obs = e.reset(env.eval_seeds(1)[0])
    page = e._bg.page
    for url in ("file:///etc/passwd", "http://example.com/"):  # from inside the page
        assert "fetch failed" in page.evaluate(
            "async (u) => { try { await fetch(u); return 'read'; } catch (e) { return 'fetch failed'; } }", url)
    for url in ("file:///etc/passwd", "http://example.com/"):  # the page itself

        with pytest.raises(Exception, match="ERR_BLOCKED_BY_CLIENT"):
            page.goto(url)
        assert page.url != url and not page.url.startswith(("file:///etc", "http"))
    assert {"file:///etc/passwd"} <= set(e._bg.blocked) and len(e._bg.blocked) >= 2
    # the page is broken now; the next episode starts clean
    obs = e.reset(env.eval_seeds(1)[0])
    assert "] button 'Close'" in obs.axtree


def test_browser_crash_is_env_error_and_recovers(envs):
    import os
    import signal
    e = envs("focus-text")
    obs = e.reset(env.eval_seeds(1)[0])
    for pid in watchdog.chromium_pids(e.marker)[:1]:  # the browser process itself
        os.kill(pid, signal.SIGKILL)
    obs, reward, done, info = e.step("click('12')")
    assert done and info["env_error"] and reward == 0.0 and not info["success"]
    obs = e.reset(env.eval_seeds(1)[0])  # relaunches Chromium
    obs, reward, done, info = e.step(f"focus('{_bid(obs, 'textbox')}')")
    assert info["success"] and not info["env_error"]


def test_two_envs_one_thread(envs):
    a, b = envs("click-button"), envs("click-dialog-2")
    oa, ob = a.reset(env.eval_seeds(3)[2]), b.reset(env.eval_seeds(3)[2])
    la = oa.goal.split('"')[1]
    lb = {"x": "Close"}.get(ob.goal.split('"')[1], ob.goal.split('"')[1])
    _, rb, _, _ = b.step(f"click('{_bid(ob, 'button', lb)}')")
    _, ra, _, _ = a.step(f"click('{_bid(oa, 'button', la)}')")
    assert ra == rb == 1.0


@pytest.mark.parametrize("code,timeout", [
    # stopping the main thread's Playwright in an atexit hook made every such script hang at exit
    ("import env; e = env.WebEnv('click-button'); e.reset(0); e.close(); print('done')", 120),
    # `world_model.py --collect` over two tasks hung at exit: the garbage collector closed an env
    # during interpreter shutdown, and the watchdog guarding close() waited forever for its thread to start
    ("import env\nfor task in ['click-button', 'click-tab']:\n"
     "    e = env.WebEnv(task); e.reset(0); e.close()\nprint('done')", 60),
], ids=["one-browser", "two-browsers-one-after-the-other"])
def test_a_script_that_used_browsers_exits(code, timeout):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0 and r.stdout.strip().endswith("done"), r.stderr[-2000:]
