"""env.py: the action grammar (pure), then real episodes in headless Chromium (one browser per
task, reused by every test of the module)."""
import pytest

import env
from env import ActionParseError, parse_action

# ---------------------------------------------------------------------------------------------
# parse_action


@pytest.mark.parametrize("text, want", [
    ("click('13')", "click('13')"),
    ('click("13")', "click('13')"),
    ("click(13)", "click('13')"),
    ("click( '13' )", "click('13')"),
    ("dblclick('a7')", "dblclick('a7')"),
    ("fill('14', 'Myron')", "fill('14', 'Myron')"),
    ("fill(14, \"it's\")", "fill('14', \"it's\")"),
    ("fill('14', 42)", "fill('14', '42')"),
    ("fill(bid='14', value='x')", "fill('14', 'x')"),
    ("select_option('9', 'Blue')", "select_option('9', 'Blue')"),
    ("select_option('9', ['a', 'b'])", "select_option('9', ['a', 'b'])"),
    ("press('14', 'Enter')", "press('14', 'Enter')"),
    ("scroll(0, -300)", "scroll(0, -300)"),
    ("send_msg_to_user('42')", "send_msg_to_user('42')"),
    ("noop()", "noop()"),
    ("focus('12')", "focus('12')"),
    ("clear('12')", "clear('12')"),
    ("hover('12')", "hover('12')"),
    ("check('3')", "check('3')"),
    ("uncheck('3')", "uncheck('3')"),
    # prose, <think> blocks and fences are ignored; the last call wins
    ("I will click the OK button: click('15')", "click('15')"),
    ("<think>maybe click('1')? no, the button is 15</think>\nclick('15')", "click('15')"),
    ("```python\nclick('15')\n```", "click('15')"),
    ("Action:\n```\nfill('3', 'a (b) c')\n```\nDone.", "fill('3', 'a (b) c')"),
    ("click('1') then click('2')", "click('2')"),
    ("fill('3', 'click(\"9\")')", "fill('3', 'click(\"9\")')"),
])
def test_parse_accepts(text, want):
    assert parse_action(text) == want
    assert parse_action(want) == want  # canonical strings are fixed points


@pytest.mark.parametrize("text, fragment", [
    ("", "empty"),
    ("   ", "empty"),
    ("I think the answer is the OK button.", "no action"),
    ("<think>click('3')</think> I am not sure.", "no action"),
    ("goto('http://example.com')", "unknown action"),
    ("rm('x')", "unknown action"),
    ("os.system('ls')", "plain action"),
    ("page.click('13')", "plain action"),
    ("__import__('os').system('ls')", "unknown action"),
    ("click(x)", "literal"),
    ("click('1' + '2')", "literal"),
    ("fill('3', open('/etc/passwd').read())", "literal"),
    ("click()", "missing"),
    ("fill('3')", "missing"),
    ("click('1', '2')", "argument"),
    ("click('a b')", "bid"),
    ("click(-1)", "bid"),
    ("scroll('a', 'b')", "number"),
    ("press('3', '')", "key"),
    ("click(*['1'])", "args"),
])
def test_parse_rejects(text, fragment):
    with pytest.raises(ActionParseError) as e:
        parse_action(text)
    assert fragment in str(e.value)
    assert isinstance(e.value, ValueError) and len(str(e.value)) > 10


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
    assert env.url_allowed(env.os.environ["MINIWOB_URL"] + "click-button.html")
    assert env.url_allowed("about:blank")
    assert not env.url_allowed("file:///etc/passwd")
    assert not env.url_allowed("file://" + env.MINIWOB_HTML_DIR + "/../../../../etc/passwd")
    assert not env.url_allowed("file://" + env.MINIWOB_HTML_DIR + "-evil/x.html")
    assert not env.url_allowed("http://example.com/")
    assert not env.url_allowed("https://localhost:8080/")


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


def _bid(obs, role, name):
    for line in obs.axtree.splitlines():
        line = line.strip()
        if line.startswith("[") and f"] {role} {name!r}" in line:
            return line[1:line.index("]")]
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
        wrong = [l.strip() for l in obs.axtree.splitlines() if "] button '" in l and f"'{label}'" not in l]
        if wrong:
            break
    wrong = wrong[0]
    obs, reward, done, info = e.step(f"click('{wrong[1:wrong.index(']')]}')")
    assert done and reward == 0.0 and not info["success"] and info["raw_reward"] < 1


def test_link_spans_have_bids(envs):
    e = envs("click-link")
    obs = e.reset(env.eval_seeds(2)[1])
    word = obs.goal.split('"')[1]
    obs, reward, done, info = e.step(f"click('{_bid(obs, 'generic', word)}')")
    assert info["success"] and reward == 1.0


def test_fill_then_submit_and_parse_error_continues(envs):
    e = envs("enter-text")
    obs = e.reset(env.eval_seeds(1)[0])
    text = obs.goal.split('"')[1]
    box = [l.strip() for l in obs.axtree.splitlines() if "] textbox" in l][0]
    box = box[1:box.index("]")]
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
    for pid in env.chromium_pids(e.marker)[:1]:  # the browser process itself
        os.kill(pid, signal.SIGKILL)
    obs, reward, done, info = e.step("click('12')")
    assert done and info["env_error"] and reward == 0.0 and not info["success"]
    obs = e.reset(env.eval_seeds(1)[0])  # relaunches Chromium
    box = [l.strip() for l in obs.axtree.splitlines() if "] textbox" in l][0]
    obs, reward, done, info = e.step(f"focus('{box[1:box.index(']')]}')")
    assert info["success"] and not info["env_error"]


def test_two_envs_one_thread(envs):
    a, b = envs("click-button"), envs("click-dialog-2")
    oa, ob = a.reset(env.eval_seeds(3)[2]), b.reset(env.eval_seeds(3)[2])
    la = oa.goal.split('"')[1]
    lb = {"x": "Close"}.get(ob.goal.split('"')[1], ob.goal.split('"')[1])
    _, rb, _, _ = b.step(f"click('{_bid(ob, 'button', lb)}')")
    _, ra, _, _ = a.step(f"click('{_bid(oa, 'button', la)}')")
    assert ra == rb == 1.0


def test_a_script_that_used_a_browser_exits():
    # Stopping the main thread's Playwright in an atexit hook made every such script hang at exit
    # (tried against a hang seen once at the end of `world_model.py --collect`): keep it out.
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = "import env; e = env.WebEnv('click-button'); e.reset(0); e.close(); print('done')"
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("done"), r.stderr[-2000:]
