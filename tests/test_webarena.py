"""WebArena-Lite without the real sites: a small shop served on 127.0.0.1 (tests/local_site.py), real
Chromium through WebEnv, and real WebArena-Lite task configs rewritten to that shop, run by BrowserGym's
own WebArenaLiteTask (its login, its start page) and scored by its string, URL and page evaluators."""
import json
import os
import re
import socket
import subprocess
import sys

import pytest

import benchmarks
import env
import llm_judge
import webarena_lite
from local_site import FakeJudge, LocalSite
from sandbox import chromium_args, web_route_pattern, web_url_allowed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lite(old_id: int, **changes) -> dict:
    """A real WebArena-Lite config (by its WebArena id), some fields rewritten for the local shop."""
    c = json.loads(json.dumps(webarena_lite.config(f"webarenalite.{old_id}")))
    c["eval"].update(changes.pop("eval", {}))
    c.update(changes)
    return c


# (template id, its evaluators): each rewritten config keeps its template's evaluators and site (shopping)
PRICE = lite(23, start_url="__SHOPPING__/product/a", intent="What is the price of the Leather bag?",
             eval={"reference_answers": {"must_include": ["$19.99"]}})
SEARCH = lite(162, start_url="__SHOPPING__", intent="Search the shop for bags.",
              eval={"reference_url": "__SHOPPING__/catalogsearch/result/?q=bag"})
COMMENT = lite(118, start_url="__SHOPPING__/contact", intent="Tell the shop that the strap broke after three days.",
               eval={"program_html": [{"url": "__SHOPPING__/account", "locator": "document.querySelector('#comment').outerText",
                                       "required_contents": {"must_include": ["strap broke after three days"]}}]})
JUDGED = lite(117, start_url="__SHOPPING__/product/b", intent="How much is the Canvas bag?",
              eval={"reference_answers": {"fuzzy_match": ["twelve dollars and fifty cents"]}})
TASKS = {"webarenalite.test-price": PRICE, "webarenalite.test-search": SEARCH, "webarenalite.test-comment": COMMENT,
         "webarenalite.test-judged": JUDGED}


def test_the_templates_are_what_the_tests_claim():
    kinds = {23: ["string_match"], 162: ["url_match"], 118: ["program_html"], 117: ["string_match"]}
    for old_id, kind in kinds.items():
        assert webarena_lite.config(f"webarenalite.{old_id}")["eval"]["eval_types"] == kind
        assert webarena_lite.config(f"webarenalite.{old_id}")["sites"] == ["shopping"]
    assert webarena_lite.needs_judge("webarenalite.117") and not webarena_lite.needs_judge("webarenalite.23")


@pytest.fixture(scope="module")
def site():
    """The shop on 127.0.0.1 (every WA_* site on it) and `site.other_site` on 127.0.0.2, never to be reached."""
    other = LocalSite(host="127.0.0.2").start()
    shop = LocalSite(other=other.url("").rstrip("/")).start()
    shop.other_site = other
    saved = {k: os.environ.get(k) for k in (*webarena_lite.SITE_VARS, llm_judge.URL_VAR, llm_judge.MODEL_VAR)}
    os.environ.update(shop.environ())
    os.environ.pop(llm_judge.URL_VAR, None)
    os.environ.pop(llm_judge.MODEL_VAR, None)
    for name, config in TASKS.items():
        webarena_lite.register(name, config)
    yield shop
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    shop.stop()
    other.stop()


@pytest.fixture(scope="module")
def e(site):
    made = env.WebEnv("webarenalite.test-price", max_steps=30)
    yield made
    made.close()


def _start(e, task: str, max_steps: int = 30) -> env.Obs:
    e.max_steps = max_steps
    obs = e.reset(0, task=task)
    assert not obs.env_error, obs.error
    return obs


def _step(e, action: str):
    obs, reward, done, info = e.step(action)
    assert not info["env_error"], info["error"]
    return obs, reward, done, info


def _bid(obs, role: str, name: str) -> str:
    return re.search(rf"\[(\w+)\] {role} {re.escape(repr(name))}", obs.axtree).group(1)


# ---------------------------------------------------------------------------------------------
# configuration


def test_missing_site_variables_are_named(monkeypatch, capsys):
    for v in webarena_lite.SITE_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("WA_SHOPPING", "http://gpu-node:7770")
    with pytest.raises(webarena_lite.MissingSites) as info:
        webarena_lite.site_urls()
    assert all(v in str(info.value) for v in webarena_lite.SITE_VARS[1:]) and "set WA_SHOPPING," not in str(info.value)
    import eval as webeval

    with pytest.raises(SystemExit) as stop:
        webeval.main(["--benchmark", "webarena-lite"])
    assert stop.value.code == 2
    assert "WA_SHOPPING_ADMIN" in capsys.readouterr().err
    for v in webarena_lite.SITE_VARS[1:]:
        monkeypatch.setenv(v, "http://gpu-node:1")
    monkeypatch.setenv("WA_MAP", "not a url")
    with pytest.raises(ValueError, match="WA_MAP"):
        webarena_lite.allowed_hosts()


def test_splits_are_disjoint_and_a_task_config_is_its_own_seed(monkeypatch):
    test, train = webarena_lite.test_tasks(), webarena_lite.train_tasks()
    assert len(test) == 165 and len(train) == 647
    ids = lambda names: {n.rsplit(".", 1)[1] for n in names}
    assert not ids(test) & ids(train) and len(ids(test) | ids(train)) == 812
    monkeypatch.delenv(llm_judge.URL_VAR, raising=False)
    sel = benchmarks.select("webarena-lite", None, "eval")
    assert len(sel.skipped) == 40 and len(sel.tasks) == 125 and "LLM judge" in sel.note()
    assert len(benchmarks.select("webarena-lite", None, "train").skipped) == 86
    monkeypatch.setenv(llm_judge.URL_VAR, "http://127.0.0.1:9/v1")
    assert benchmarks.select("webarena-lite", None, "eval").tasks == test
    assert benchmarks.eval_seeds("webarena-lite", 1) == [0]
    with pytest.raises(ValueError, match="once"):
        benchmarks.eval_seeds("webarena-lite", 2)
    with pytest.raises(ValueError, match="not webarena-lite tasks"):
        benchmarks.select("webarena-lite", "click-button", "eval")
    with pytest.raises(ValueError, match="unknown"):
        benchmarks.select("webarena-lite", "webarenalite.5", "eval")  # (5 is not one of the 165)
    assert benchmarks.select("miniwob", None, "eval").tasks == env.SUITE  # MiniWoB as before


def test_the_router_allows_exactly_the_sites_hosts():
    hosts = frozenset({"127.0.0.1", "shop.example"})
    assert web_url_allowed("http://127.0.0.1:7770/x?q=1", hosts) and web_url_allowed("https://SHOP.example/", hosts)
    assert web_url_allowed("ws://shop.example:8080/socket", hosts) and web_url_allowed("about:blank", hosts)
    for url in ("http://127.0.0.2/", "http://localhost:7770/", "http://shop.example.evil.com/", "file:///etc/passwd",
                "chrome://settings", "ftp://shop.example/", "http://[::1]:80/", "http://shop.example:99999/"):
        assert not web_url_allowed(url, hosts), url
    routed = web_route_pattern(hosts)  # what the browser hands to Python's router: all but the plainly allowed
    for url in ("http://127.0.0.1:7770/x?q=1", "https://shop.example", "ws://shop.example:8080/s", "about:blank"):
        assert not routed.search(url), url
    for url in ("http://127.0.0.1.evil.com/", "http://127.0.0.1@evil.com/", "http://localhost/", "file:///etc/passwd"):
        assert routed.search(url) and not web_url_allowed(url, hosts), url
    assert "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE shop.example" in chromium_args(hosts)
    assert "--host-resolver-rules=MAP * ~NOTFOUND" in chromium_args(None)  # MiniWoB's, unchanged


# ---------------------------------------------------------------------------------------------
# actions, tabs and the router on real pages


def test_navigation_tab_and_keyboard_actions(e, site):
    obs = _start(e, "webarenalite.test-search")
    assert obs.url == site.url("/") and site.logged_in  # BrowserGym's WebArena login ran on our login page
    assert type(e._bg.task).__name__ == "WebArenaLiteTask"
    obs, *_ = _step(e, f"focus('{_bid(obs, 'textbox', 'Search')}')")
    obs, *_ = _step(e, "keyboard_type('ba')")
    obs, *_ = _step(e, "keyboard_insert_text('g')")
    obs, *_ = _step(e, "keyboard_press('Enter')")
    assert obs.url == site.url("/catalogsearch/result/?q=bag") and "2 items" in obs.axtree
    obs, *_ = _step(e, "go_back()")
    assert obs.url == site.url("/")
    obs, *_ = _step(e, "go_forward()")
    assert obs.url == site.url("/catalogsearch/result/?q=bag")
    obs, *_ = _step(e, f"goto('{site.url('/product/b')}')")
    assert "Canvas bag" in obs.axtree and obs.tabs == ()
    for action in ("scroll(0, 200)", "keyboard_down('Shift')", "keyboard_up('Shift')", "keyboard_press('Control+a')"):
        obs, *_ = _step(e, action)
        assert not obs.error, (action, obs.error)
    obs, *_ = _step(e, "new_tab()")
    assert obs.url == "about:blank" and obs.tabs[1] == "Tab 1 (active): '' about:blank" and not obs.events
    obs, *_ = _step(e, f"goto('{site.url('/deals')}')")
    obs, *_ = _step(e, "tab_focus(0)")
    assert obs.url == site.url("/product/b")
    assert obs.tabs == (f"Tab 0 (active): 'Canvas bag' {site.url('/product/b')}",
                        f"Tab 1: 'Deals of the day' {site.url('/deals')}")
    obs, *_ = _step(e, "tab_focus(7)")
    assert obs.error == "there is no tab 7: the tabs are 0 to 1" and obs.url == site.url("/product/b")  # it goes on
    obs, *_ = _step(e, "tab_close()")
    assert obs.url == site.url("/deals") and obs.tabs == ()  # BrowserGym's rule: the last tab becomes active
    obs, _, done, info = _step(e, "goto('http://x.example/'")  # nothing parsed: a step spent
    assert "ActionParseError" in info["error"] and not done


def test_a_tab_the_page_opens_is_followed_listed_and_told_once(e, site):
    obs = _start(e, "webarenalite.test-search")
    obs, *_ = _step(e, f"click('{_bid(obs, 'link', 'Deals in a new tab')}')")
    assert obs.url == site.url("/deals") and "Deals of the day" in obs.axtree
    assert obs.tabs == (f"Tab 0: 'One Stop Market' {site.url('/')}", f"Tab 1 (active): 'Deals of the day' {site.url('/deals')}")
    assert obs.events == (f"Tab: the page opened a new tab ('{site.url('/deals')}'); it is now the active tab.",)
    head = f"Goal: Search the shop for bags.\nURL: {site.url('/deals')}\n{obs.tabs[0]}\n{obs.tabs[1]}\n[" 
    assert obs.text.startswith(head)
    obs, *_ = _step(e, "noop()")
    assert obs.events == ()  # told once
    obs, *_ = _step(e, "tab_focus(0)")
    obs, *_ = _step(e, f"click('{_bid(obs, 'button', 'Open deals')}')")  # window.open
    assert obs.url == site.url("/deals") and len(obs.tabs) == 3 and obs.tabs[2].startswith("Tab 2 (active)")
    assert len(obs.events) == 1 and obs.events[0].startswith("Tab: the page opened a new tab")


def test_only_the_sites_hosts_are_reached(e, site):
    other = site.other_site.url("").rstrip("/")
    obs = _start(e, "webarenalite.test-search")
    for link, role, path in (("Partner site", "link", "/partner"), ("Go to partner", "button", "/scripted"),
                             ("This shop by another name", "link", None)):
        obs, *_ = _step(e, f"click('{_bid(obs, role, link)}')")
        url = other + path if path else f"http://localhost:{site.port}/"
        assert obs.events == (f"Blocked: '{url}' is not one of the task's sites; it was not loaded.",), link
        assert url in e._bg.blocked
        obs, *_ = _step(e, "go_back()")
        assert obs.url == site.url("/")
    obs, *_ = _step(e, f"click('{_bid(obs, 'button', 'Ping partner')}')")  # a fetch() to the other host
    assert other + "/beacon" in e._bg.blocked and e._bg.page.title() == "fetch failed"
    obs, *_ = _step(e, f"click('{_bid(obs, 'link', 'Local file')}')")  # file:// from a web page: never loads
    assert obs.url == site.url("/")
    for url in (other + "/typed", "file:///etc/hostname", f"http://localhost:{site.port}/"):
        obs, *_ = _step(e, f"goto({url!r})")
        assert "is not one of the task's sites" in obs.error and obs.url == site.url("/"), url
    assert site.other_site.requests == []  # nothing ever reached the other host


# ---------------------------------------------------------------------------------------------
# BrowserGym's task class and WebArena-Lite's evaluators on rewritten configs


def test_a_string_match_answer_is_scored_by_the_benchmarks_evaluator(e, site):
    obs = _start(e, "webarenalite.test-price")
    assert obs.goal == "What is the price of the Leather bag?" and obs.url == site.url("/product/a")
    obs, reward, done, info = _step(e, "send_msg_to_user('The Leather bag costs $19.99.')")
    assert (reward, done, info["success"]) == (1.0, True, True)
    _start(e, "webarenalite.test-price")
    obs, reward, done, info = _step(e, "send_msg_to_user('It costs $12.50.')")
    assert (reward, done, info["success"], info["error"]) == (0.0, True, False, "")
    _start(e, "webarenalite.test-price")
    obs, reward, done, info = _step(e, "report_infeasible('there is no price')")  # the answer "N/A"
    assert (reward, done, info["success"]) == (0.0, True, False)
    _start(e, "webarenalite.test-price", max_steps=2)
    _step(e, "noop()")
    obs, reward, done, info = _step(e, "noop()")  # the budget ends it, with no answer
    assert (reward, done, info["truncated"]) == (0.0, True, True)


def test_a_url_match_task_is_scored_on_the_final_page(e, site):
    obs = _start(e, "webarenalite.test-search")
    obs, *_ = _step(e, f"fill('{_bid(obs, 'textbox', 'Search')}', 'bag')")
    obs, reward, done, _ = _step(e, f"press('{_bid(obs, 'textbox', 'Search')}', 'Enter')")
    assert (reward, done) == (0.0, False)  # the evaluators run only when the episode ends
    obs, reward, done, info = _step(e, "send_msg_to_user('done')")
    assert (reward, done, info["success"]) == (1.0, True, True)
    obs = _start(e, "webarenalite.test-search")
    obs, *_ = _step(e, f"fill('{_bid(obs, 'textbox', 'Search')}', 'scarf')")
    obs, *_ = _step(e, f"press('{_bid(obs, 'textbox', 'Search')}', 'Enter')")
    obs, reward, done, info = _step(e, "send_msg_to_user('done')")
    assert (reward, done, info["success"]) == (0.0, True, False)
    obs = _start(e, "webarenalite.test-search", max_steps=2)  # WebArena's rule: the last page counts at the budget
    obs, *_ = _step(e, f"fill('{_bid(obs, 'textbox', 'Search')}', 'bag')")
    obs, reward, done, info = _step(e, f"press('{_bid(obs, 'textbox', 'Search')}', 'Enter')")
    assert (reward, done, info["success"]) == (1.0, True, True)


def test_a_program_html_task_is_scored_on_the_page_it_names(e, site):
    for comment, want in (("The strap broke after three days, sadly.", 1.0), ("All good, thanks!", 0.0)):
        obs = _start(e, "webarenalite.test-comment")
        obs, *_ = _step(e, f"fill('{_bid(obs, 'textbox', 'Comment')}', {comment!r})")
        obs, *_ = _step(e, f"click('{_bid(obs, 'button', 'Submit')}')")
        assert "Thank you" in obs.axtree
        obs, reward, done, info = _step(e, "send_msg_to_user('done')")
        assert (reward, done, info["success"]) == (want, True, want == 1.0), comment
        assert site.requests[-1] == "/account"  # the evaluator loaded the page its config names


def test_a_judged_answer_goes_to_the_judge_and_is_never_scored_without_one(e, site, monkeypatch):
    monkeypatch.delenv(llm_judge.URL_VAR, raising=False)  # (and restored afterwards, whatever configure sets)
    monkeypatch.delenv(llm_judge.MODEL_VAR, raising=False)
    assert benchmarks.select("webarena-lite", "webarenalite.test-judged,webarenalite.test-price", "eval").skipped == [
        "webarenalite.test-judged"]
    obs = e.reset(0, task="webarenalite.test-judged")  # refused before any page loads: neither success nor failure
    assert obs.env_error and "LLM judge" in obs.error
    obs, reward, done, info = e.step("send_msg_to_user('12.50')")
    assert info["env_error"] and done and not info["success"]

    def verdict(prompt: str) -> str:
        answer = re.search(r"student answer: (.*)", prompt).group(1)
        return "correct" if "12.50" in answer else "incorrect"

    judge = FakeJudge(verdict)
    try:
        llm_judge.configure(judge.url)
        for answer, want in (("It is $12.50.", 1.0), ("It is $19.99.", 0.0)):
            _start(e, "webarenalite.test-judged")
            obs, reward, done, info = _step(e, f"send_msg_to_user({answer!r})")
            assert (reward, done, info["success"]) == (want, True, want == 1.0), answer
        asked = judge.asked[-1]
        assert asked["path"] == "/v1/chat/completions" and asked["model"] == "fake-judge"  # the server's model
        assert asked["temperature"] == 0 and asked["messages"][0]["content"] == "You are a helpful assistant"
        assert "reference answer: twelve dollars and fifty cents" in asked["messages"][1]["content"]
        assert "question: How much is the Canvas bag?" in asked["messages"][1]["content"]
    finally:
        judge.stop()
    with socket.socket() as s:  # a judge that cannot be reached: env_error, not a failure
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    monkeypatch.setattr(llm_judge, "RETRIES", 0)
    llm_judge.configure(f"http://127.0.0.1:{dead}/v1", "m")
    _start(e, "webarenalite.test-judged")
    obs, reward, done, info = e.step("send_msg_to_user('12.50')")
    assert info["env_error"] and "judge" in info["error"] and not info["success"]


def test_a_loopback_judge_is_reached_directly_whatever_proxy_is_set(monkeypatch):
    # http_proxy set for the cluster and no no_proxy: a judge on 127.0.0.1, localhost or ::1's name goes
    # straight to it; a remote judge still goes through the proxy (here a second fake endpoint that
    # answers every request it is sent, absolute URL in the request line)
    judge, proxy = FakeJudge(lambda prompt: "from the judge"), FakeJudge(lambda prompt: "from the proxy")
    try:
        for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
            monkeypatch.setenv(var, proxy.url.removesuffix("/v1"))
        for var in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(var, raising=False)
        port = judge.url.split(":")[-1].split("/")[0]
        msgs = [{"role": "user", "content": "is it right?"}]
        for url in (judge.url, f"http://localhost:{port}/v1", f"http://0.0.0.0:{port}/v1"):
            monkeypatch.setenv(llm_judge.URL_VAR, url)
            monkeypatch.setenv(llm_judge.MODEL_VAR, "m")
            assert llm_judge.chat_completion("m", msgs, 0, 8) == "from the judge", url
        assert len(judge.asked) == 3 and proxy.asked == []
        monkeypatch.setenv(llm_judge.URL_VAR, "http://judge.example:8000/v1")
        assert llm_judge.chat_completion("m", msgs, 0, 8) == "from the proxy"
        assert proxy.asked[-1]["path"] == "http://judge.example:8000/v1/chat/completions"
        # clients the project does not own (libwebarena's evaluators use requests) once no_proxy lists loopback
        import requests

        env = {"no_proxy": "example.org"}
        llm_judge.direct_loopback(env)
        assert env["no_proxy"].startswith("example.org,localhost,127.0.0.1") and env["NO_PROXY"].startswith("localhost")
        monkeypatch.setenv("no_proxy", env["no_proxy"])
        body = {"model": "m", "messages": msgs}
        for url in (judge.url, f"http://localhost:{port}/v1"):
            reply = requests.post(url + "/chat/completions", json=body, timeout=10).json()
            assert reply["choices"][0]["message"]["content"] == "from the judge", url
        assert len(judge.asked) == 5 and len(proxy.asked) == 1
        assert [llm_judge.is_loopback(u) for u in ("http://127.0.0.2:1", "http://[::1]:8000", "http://LOCALHOST./v1",
                                                   "http://0.0.0.0:8000/v1", "http://[::ffff:127.0.0.1]:80",
                                                   "http://localhost.localdomain", "http://10.0.0.1",
                                                   "http://localhost.example", "http://[::ffff:10.0.0.1]")] == [
            True, True, True, True, True, True, False, False, False]
    finally:
        judge.stop()
        proxy.stop()


def test_judge_urls():
    assert llm_judge.base_url("http://h:8000") == "http://h:8000/v1"
    assert llm_judge.base_url("https://h/api/v1/") == "https://h/api/v1"
    with pytest.raises(ValueError):
        llm_judge.base_url("h:8000")


# ---------------------------------------------------------------------------------------------
# eval.py with the sites set (here they cannot be reached)


def test_eval_runs_past_configuration_once_the_sites_are_set(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("WA_", "WEBDREAM_JUDGE"))}
    environ.update({v: f"http://127.0.0.1:{port}/{v.lower()}" for v in webarena_lite.SITE_VARS}, HF_HUB_OFFLINE="1")
    out = tmp_path / "eval"
    run = subprocess.run([sys.executable, "eval.py", "--benchmark", "webarena-lite", "--tasks",
                          "webarenalite.23,webarenalite.117", "--num-envs", "1", "--out", str(out)],
                         cwd=REPO, env=environ, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["benchmark"] == "webarena-lite" and results["skipped"] == {"need_llm_judge": ["webarenalite.117"]}
    assert results["tasks"]["webarenalite.23"]["env_error"] == 1  # it tried the site: connection refused
    assert "Skipped: 1 task(s) graded by an LLM judge" in (out / "results.md").read_text()
    traj = json.loads((out / "trajectories.jsonl").read_text().splitlines()[0])
    assert "ERR_CONNECTION_REFUSED" in traj["error"] or "connect" in traj["error"].lower(), traj["error"]


# ---------------------------------------------------------------------------------------------
# the run scripts: prompts, rollouts and flags on WebArena


def test_evaluate_rolls_out_with_the_web_prompt(site, tok):
    import compress
    import eval as webeval
    from scripted_train import ScriptedReplies

    seen = []

    class Agent(ScriptedReplies):  # answers from the page, as a policy would
        def reply(self, prompt):
            text = tok.decode(prompt)
            seen.append(text)
            if "Leather bag" in text and "$19.99" in text:
                return "<think>the price is on the page</think>send_msg_to_user('$19.99')"
            return "goto('http://elsewhere.example/')"

    settings = compress.PromptSettings(benchmark="webarena-lite", max_tokens=2048, think=True)
    summary, trajs = webeval.evaluate(Agent(tok), tok, ["webarenalite.test-price", "webarenalite.test-search"], [0],
                                      max_steps=2, num_envs=2, prompt=settings, progress=False)
    assert summary["tasks"]["webarenalite.test-price"]["success"] == 1.0
    assert summary["tasks"]["webarenalite.test-search"]["success"] == 0.0
    assert all(compress.WEB_SYSTEM_PROMPT in t and "goto('url')" in t for t in seen)
    search = next(t for t in trajs if t["task"] == "webarenalite.test-search")
    assert "is not one of the task's sites" in search["turns"][1]["observation"] and search["steps"] == 2


def test_train_flags_select_the_webarena_split(site, monkeypatch, capsys):
    import train

    monkeypatch.delenv(llm_judge.URL_VAR, raising=False)
    args = train.parse_args(["--mode", "real", "--benchmark", "webarena-lite", "--out", "/tmp/webdream-wa-flags"])
    assert len(args.tasks) == 647 - 86 and all(t.startswith("webarena.") for t in args.tasks)
    assert len(args.eval_tasks) == 125 and args.step_timeout == benchmarks.POOL_STEP_TIMEOUT_S["webarena-lite"]
    assert (args.max_steps, args.max_prompt_tokens, args.max_new_tokens) == (15, 8192, 256)
    assert args.prompt.benchmark == "webarena-lite" and "Skipped: 86" in capsys.readouterr().err
    miniwob = train.parse_args(["--mode", "real", "--out", "/tmp/webdream-wa-flags"])
    assert miniwob.tasks == env.SUITE and miniwob.eval_tasks == env.SUITE and miniwob.step_timeout == 60.0
    assert (miniwob.max_steps, miniwob.max_prompt_tokens, miniwob.prompt.benchmark) == (6, 1024, "miniwob")
    for argv in (["--mode", "dream"], ["--mode", "real", "--tasks", "click-button"]):
        with pytest.raises(SystemExit):
            train.parse_args(argv + ["--benchmark", "webarena-lite", "--out", "/tmp/webdream-wa-flags"])
