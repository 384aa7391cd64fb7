"""The asynchronous rollout on real Chromium with a tiny model: faults end one episode, lose none."""
import functools
import os
import random
import re
import signal
import threading
import time
import types

import pytest

import env as webenv
import generators
import policy
import watchdog
from rollout import EnvPool, EnvProcess, rollout
from scripted_train import ScriptedReplies


@pytest.fixture(scope="module")
def agent():
    tok = policy.load_tokenizer()
    return policy.tiny_model(tok), tok



def when_mid_episode(workers: EnvPool, act) -> dict:
    """In a thread: wait (up to 60 s) until a worker is in the middle of an episode (at least one turn
    taken), then call act(worker, env, traj) once. Returns a dict that then holds the traj's seed
    (plus whatever act put there through the returned dict's update)."""
    caught: dict = {}

    def watch():
        deadline = time.time() + 60
        while time.time() < deadline:
            for w in workers.workers:
                env, current = w.env, w.current
                if current is not None and env is not None and current[2]["turns"]:
                    caught["seed"] = current[2]["seed"]
                    act(w, env, caught)
                    return
            time.sleep(0.01)
    threading.Thread(target=watch, daemon=True).start()
    return caught

def test_results_in_job_order_with_exact_token_records(agent):
    model, tok = agent
    workers = EnvPool(lambda task: webenv.WebEnv(task, max_steps=2), tok, num_envs=3)
    jobs = [("click-button", 10_000), ("enter-text", 10_001), ("click-link", 10_002), ("focus-text", 10_003)]
    try:
        trajs, stats = rollout(generators.HFGenerator(model, tok), tok, workers, jobs, max_new_tokens=6)
    finally:
        workers.close()
    assert [(t["task"], t["seed"]) for t in trajs] == jobs  # each worker served any task, results in job order
    assert stats["env_steps"] == sum(t["steps"] for t in trajs) == 8  # a random tiny model never solves: 2 steps each
    for t in trajs:
        assert not t["env_error"] and t["goal"]
        for u in t["turns"]:
            assert len(u["response_ids"]) == len(u["response_logprobs"]) >= 1
            assert u["observation"] in tok.decode(u["prompt_ids"])  # the prompt holds the page it was built from


def test_a_killed_browser_ends_only_its_episode(agent):
    model, tok = agent
    workers = EnvPool(lambda task: webenv.WebEnv(task, max_steps=3), tok, num_envs=3)
    jobs = [("click-button", 10_010 + i) for i in range(6)]
    victim = when_mid_episode(workers, lambda w, env, caught: env.kill())  # SIGKILL its Chromium
    try:
        trajs, _ = rollout(generators.HFGenerator(model, tok), tok, workers, jobs, max_new_tokens=6)
    finally:
        workers.close()
    assert victim, "no episode was caught mid-way"
    assert all(t is not None for t in trajs)  # nothing lost
    errors = [t for t in trajs if t["env_error"]]
    assert [t["seed"] for t in errors] == [victim["seed"]]
    assert all(t["steps"] == 3 for t in trajs if not t["env_error"])  # the others ran to the step limit


def test_a_hung_browser_times_out_as_env_error(agent):
    model, tok = agent
    # 8 s: long enough that a healthy reset or step on two busy cores never reaches it (3 s did)
    workers = EnvPool(lambda task: webenv.WebEnv(task, max_steps=3), tok, num_envs=2, step_timeout=8.0)
    jobs = [("click-button", 10_020 + i) for i in range(4)]

    def freeze(w, env, caught):  # SIGSTOP its Chromium: the next step hangs until the watchdog acts
        for pid in watchdog.chromium_pids(env.marker):
            os.kill(pid, signal.SIGSTOP)
    frozen = when_mid_episode(workers, freeze)
    t0 = time.time()
    try:
        trajs, stats = rollout(generators.HFGenerator(model, tok), tok, workers, jobs, max_new_tokens=6)
    finally:
        workers.close()
    assert frozen and time.time() - t0 < 60
    hung = [t for t in trajs if t["env_error"]]
    assert [t["seed"] for t in hung] == [frozen["seed"]] and "timed out" in hung[0]["error"]
    assert all(t is not None for t in trajs) and stats.get("env_timeouts") == 1


class _FirstStepHangs:
    """A browser-free environment with one-step episodes. The very first step of all hangs until the
    pool's watchdog has abandoned its worker; every other step waits for `state.go` (an Event), so that
    jobs are still queued when the abandoned thread wakes up."""

    def __init__(self, state):
        self.state = state

    def reset(self, seed, task=None):
        return webenv.Obs(goal="Click OK.", url="x.html", axtree="[1] button 'OK'")

    def step(self, text):
        if not self.state.hung:
            self.state.hung = True
            me = threading.current_thread()  # the worker (rollout._Worker) that runs this step
            deadline = time.monotonic() + 60
            while not me.abandoned and time.monotonic() < deadline:  # polls a flag: rollout has no event for it
                time.sleep(0.01)
        else:
            self.state.go.wait(timeout=60)
        return webenv.Obs(goal="Click OK.", url="x.html", axtree=""), 1.0, True, {"success": True, "env_error": False}

    def close(self):
        pass


def test_a_timed_out_worker_takes_no_job_on_its_way_out(agent):
    # The watchdog abandons the hung worker and starts a fresh one. When the abandoned thread wakes
    # up it must not take a queued job: that job would be lost and the rollout would wait forever
    # (seen in dream mode, where steps wait on the world model's lock).
    model, tok = agent
    state = types.SimpleNamespace(hung=False, go=threading.Event())
    # 5 s: the other steps wait only until the abandoned thread has ended, a few ms
    workers = EnvPool(lambda task: _FirstStepHangs(state), tok, num_envs=1, step_timeout=5.0)
    first = workers.workers[0]
    out = {}
    jobs = [("click-button", i) for i in range(12)]  # all but two still queued when the hung step ends
    runner = threading.Thread(target=lambda: out.update(r=rollout(generators.HFGenerator(model, tok), tok, workers, jobs, max_new_tokens=4)),
                              daemon=True)
    runner.start()
    try:
        first.join(timeout=30)  # abandoned, it wakes up and ends, with jobs in the queue
        assert first.abandoned and not first.is_alive(), "the abandoned worker went on (with a queued job)"
    finally:
        state.go.set()
        runner.join(timeout=60)
        workers.close()
    assert not runner.is_alive(), "the rollout never finished: a job was lost"
    trajs, stats = out["r"]
    assert [t["env_error"] for t in trajs] == [True] + [False] * 11 and stats["env_timeouts"] == 1


def _record(t: dict) -> tuple:
    """Everything in a trajectory that must not depend on where its env ran."""
    return (t["task"], t["seed"], t["goal"], t["steps"], t["reward"], t["success"], t["env_error"],
            [(u["prompt_ids"], u["response_ids"], u["action"], u["observation"], u["error"]) for u in t["turns"]])


def test_env_processes_give_the_threads_trajectories(agent):
    model, tok = agent
    make = functools.partial(webenv.WebEnv, max_steps=2)  # picklable, unlike a lambda
    jobs = [("click-button", 10_030), ("enter-text", 10_031), ("click-link", 10_032)]
    out = {}
    for processes in (False, True):
        workers = EnvPool(make, tok, num_envs=2, processes=processes)
        try:
            # greedy, one prompt per generate call: the replies cannot depend on which agents share a batch
            out[processes], stats = rollout(generators.HFGenerator(model, tok), tok, workers, jobs, temperature=0.0, max_new_tokens=6, gen_batch=1)
            envs = [w.env for w in workers.workers if w.env is not None]
        finally:
            workers.close()
        assert envs and all(isinstance(e, EnvProcess) == processes for e in envs)
        assert stats["env_steps"] == 6
    assert not any(t["env_error"] for t in out[True])
    assert [_record(t) for t in out[True]] == [_record(t) for t in out[False]]


def test_env_processes_need_a_picklable_factory(tok):
    with pytest.raises(TypeError, match="picklable"):
        EnvPool(lambda task: webenv.WebEnv(task), tok, num_envs=1, processes=True)


def test_a_killed_env_process_ends_only_its_episode(agent):
    model, tok = agent
    workers = EnvPool(functools.partial(webenv.WebEnv, max_steps=3), tok, num_envs=3, processes=True)
    jobs = [("click-button", 10_040 + i) for i in range(6)]

    def kill(w, env, caught):  # SIGKILL the env's process
        caught.update(worker=w, pid=env.pid, marker=env.marker)
        os.kill(env.pid, signal.SIGKILL)
    victim = when_mid_episode(workers, kill)
    try:
        trajs, _ = rollout(generators.HFGenerator(model, tok), tok, workers, jobs, max_new_tokens=6)
        assert victim, "no episode was caught mid-way"
        assert victim["worker"].env.pid != victim["pid"]  # its next episode ran in a fresh process
    finally:
        workers.close()
    assert all(t is not None for t in trajs)  # nothing lost
    errors = [t for t in trajs if t["env_error"]]
    assert [t["seed"] for t in errors] == [victim["seed"]] and "died" in errors[0]["error"]
    assert all(t["steps"] == 3 for t in trajs if not t["env_error"])  # the others ran to the step limit
    assert watchdog.chromium_pids(victim["marker"]) == []  # the dead process's browser did not outlive it


def test_a_hung_env_process_times_out_and_is_replaced(agent):
    model, tok = agent
    # 12 s: a child process's first reset launches its Chromium, which took over 5 s under a training
    # job's load (every episode then timed out, not only the frozen one)
    workers = EnvPool(functools.partial(webenv.WebEnv, max_steps=3), tok, num_envs=2, step_timeout=12.0,
                         processes=True)
    jobs = [("click-button", 10_050 + i) for i in range(4)]

    def freeze(w, env, caught):  # SIGSTOP the env's process: its next step hangs until the watchdog acts
        caught.update(pid=env.pid, marker=env.marker)
        os.kill(env.pid, signal.SIGSTOP)
    frozen = when_mid_episode(workers, freeze)
    try:
        trajs, stats = rollout(generators.HFGenerator(model, tok), tok, workers, jobs, max_new_tokens=6)
    finally:
        workers.close()
    assert frozen
    hung = [t for t in trajs if t["env_error"]]
    assert [t["seed"] for t in hung] == [frozen["seed"]] and "timed out" in hung[0]["error"]
    assert all(t is not None for t in trajs) and stats.get("env_timeouts") == 1
    assert all(t["steps"] == 3 for t in trajs if not t["env_error"])  # the others ran to the step limit
    assert not os.path.exists(f"/proc/{frozen['pid']}") and watchdog.chromium_pids(frozen["marker"]) == []


class _CountedLaunch:
    """A browser-free environment whose first reset (its 'browser launch') takes 0.3 s and is counted."""
    lock, now, most, launches = threading.Lock(), 0, 0, 0

    def __init__(self, task):
        self.launched = False

    def reset(self, seed, task=None):
        if not self.launched:
            cls = _CountedLaunch
            with cls.lock:
                cls.now += 1
                cls.most, cls.launches = max(cls.most, cls.now), cls.launches + 1
            time.sleep(0.3)
            with cls.lock:
                cls.now -= 1
            self.launched = True
        return webenv.Obs(goal="Click OK.", url="x.html", axtree="[1] button 'OK'")

    def step(self, text):
        return webenv.Obs(goal="Click OK.", url="x.html", axtree=""), 1.0, True, {"success": True, "env_error": False}

    def close(self):
        pass


def test_browsers_launch_a_few_at_a_time(agent):
    # 16 Chromiums launched at once on 2 cores all crashed or ran past the reset deadline; the pool
    # lets at most `launches` environments start at once, and every environment still starts
    model, tok = agent
    workers = EnvPool(_CountedLaunch, tok, num_envs=8)
    try:
        trajs, _ = rollout(generators.HFGenerator(model, tok), tok, workers, [("click-button", i) for i in range(8)], max_new_tokens=4, gen_batch=8)
    finally:
        workers.close()
    assert _CountedLaunch.launches == 8 and 1 < _CountedLaunch.most <= workers.launches
    assert not any(t["env_error"] for t in trajs)


class _OwnButton:
    """A browser-free two-step episode whose pages show a button only this episode has: bid
    {seed}0 on the first page, {seed}1 on the second. A step succeeds when it clicks that button."""

    def __init__(self, task):
        self.seed, self.t = None, 0

    def page(self):
        return webenv.Obs(goal="Click the button.", url="x.html", axtree=f"[{self.seed}{self.t}] button 'Go'")

    def reset(self, seed, task=None):
        self.seed, self.t = seed, 0
        return self.page()

    def step(self, text):
        hit = text == f"click('{self.seed}{self.t}')"
        self.t += 1
        return self.page(), float(hit), self.t == 2, {"success": hit, "env_error": False, "action": text}

    def close(self):
        pass


class _ClickTheButtonInMyPrompt(ScriptedReplies):
    """A generator that answers each prompt with a click on the last button its own prompt shows,
    and records the size of every batch it is given."""

    def __init__(self, tok):
        super().__init__(tok)
        self.batches = []

    def generate(self, prompts, **kw):
        self.batches.append(len(prompts))
        return super().generate(prompts, **kw)

    def reply(self, prompt):
        return "click('%s')" % re.findall(r"\[(\d+)\] button", self.tok.decode(prompt))[-1]


def test_each_reply_goes_to_the_agent_that_asked(tok):
    # Four agents ask at once; each reply names a button of its own prompt. A reply handed to another
    # agent clicks a button that page does not have.
    gen = _ClickTheButtonInMyPrompt(tok)
    workers = EnvPool(_OwnButton, tok, num_envs=4)
    jobs = [("click-button", seed) for seed in (11, 22, 33, 44, 55, 66, 77, 88)]
    try:
        # a batch waits (up to 1 s) until all four agents have asked, so batches hold several prompts
        trajs, stats = rollout(gen, tok, workers, jobs, gen_batch=4, linger=1.0)
    finally:
        workers.close()
    assert max(gen.batches) > 1 and stats["env_steps"] == 16
    for (_, seed), t in zip(jobs, trajs):
        assert [u["response"] for u in t["turns"]] == [f"click('{seed}0')", f"click('{seed}1')"]
        assert t["seed"] == seed and t["reward"] == 1.0 and not t["env_error"]


# ---------------------------------------------------------------------------------------------
# faults outside env.step end one episode as env_error, with their text; the rollout returns


class _BadText(webenv.Obs):
    """An observation whose text cannot be rendered: building the prompt from it raises."""

    @property
    def text(self):
        raise ValueError("this page cannot be rendered")


class _FaultyPages(_OwnButton):
    """_OwnButton's episodes, whose seed picks a fault outside env.step: 1, the first observation's
    text raises; 2, the second one's; 3, step returns an info that is not a dict (the record fails)."""

    def page(self):
        if (self.seed, self.t) in ((1, 0), (2, 1)):
            return _BadText(goal="Click the button.", url="x.html", axtree="")
        return super().page()

    def step(self, text):
        obs, reward, done, info = super().step(text)
        return obs, reward, done, None if self.seed == 3 else info


class _FailsOnCall(_ClickTheButtonInMyPrompt):
    """Clicks the button of its own prompt, except that its `fail`-th generate call raises."""

    def __init__(self, tok, fail):
        super().__init__(tok)
        self.fail, self.calls, self.failed_on = fail, 0, None

    def generate(self, prompts, **kw):
        self.calls += 1
        if self.calls == self.fail:
            self.failed_on = self.tok.decode(prompts[0])
            raise RuntimeError("the GPU fell over")
        return super().generate(prompts, **kw)


def _bounded_rollout(gen, tok, pool, jobs, **kw):
    """rollout() in a thread that must end within 120 s: a regression fails, it does not hang."""
    out = {}
    t = threading.Thread(target=lambda: out.update(r=rollout(gen, tok, pool, jobs, **kw)), daemon=True)
    t.start()
    t.join(timeout=120)
    assert not t.is_alive(), "rollout() never returned"
    return out["r"]


def test_a_fault_building_a_prompt_or_a_record_ends_only_its_episode(tok):
    workers = EnvPool(_FaultyPages, tok, num_envs=2)
    jobs = [("click-button", seed) for seed in (0, 1, 2, 3, 4, 5)]
    try:
        trajs, _ = _bounded_rollout(_ClickTheButtonInMyPrompt(tok), tok, workers, jobs, gen_batch=1)
    finally:
        workers.close()
    by_seed = {t["seed"]: t for t in trajs}
    assert by_seed[1]["env_error"] and by_seed[1]["error"] == "worker error: ValueError: this page cannot be rendered"
    assert by_seed[1]["turns"] == []
    assert by_seed[2]["env_error"] and by_seed[2]["error"] == by_seed[1]["error"]
    assert [u["action"] for u in by_seed[2]["turns"]] == ["click('20')"]  # the turn before the fault is kept
    assert by_seed[3]["env_error"] and by_seed[3]["error"].startswith("worker error: AttributeError")
    for seed in (0, 4, 5):  # the others finish, solved
        assert not by_seed[seed]["env_error"] and by_seed[seed]["reward"] == 1.0 and by_seed[seed]["steps"] == 2


def test_a_generator_that_raises_ends_the_episodes_it_served(tok):
    gen = _FailsOnCall(tok, fail=3)
    workers = EnvPool(_OwnButton, tok, num_envs=2)
    jobs = [("click-button", seed) for seed in (11, 22, 33, 44)]
    try:
        trajs, stats = _bounded_rollout(gen, tok, workers, jobs, gen_batch=1)  # one prompt a call: one victim
    finally:
        workers.close()
    failed = [t for t in trajs if t["env_error"]]
    assert len(failed) == 1 and failed[0]["error"] == "worker error: RuntimeError: generation failed: RuntimeError: the GPU fell over"
    assert f"[{failed[0]['seed']}" in gen.failed_on  # the episode whose prompt was in the failed call
    assert all(t["reward"] == 1.0 and t["steps"] == 2 for t in trajs if not t["env_error"])
    assert stats["generate_calls"] >= 7


class SlowToOpenPage:
    """A fake page whose text names its seed and whose reset sleeps a random while (one step)."""

    def __init__(self, task):
        self.task = task

    def reset(self, seed, task=None):
        time.sleep(random.Random(seed * 7919 + os.getpid()).random() * 0.2)
        return types.SimpleNamespace(text=f"Goal: page {seed}\nURL: fake.html\n[11] button 'A'", goal="",
                                     env_error=False)

    def step(self, text):
        info = {"action": text, "error": "", "success": False, "env_error": False}
        return types.SimpleNamespace(text="", goal="", env_error=False), 0.0, True, info

    def close(self):
        pass


class RowReplies(ScriptedReplies):
    """Replies with each prompt's row in its call, and records the calls' prompts."""

    def __init__(self, tok):
        super().__init__(tok)
        self.calls = []

    def generate(self, prompts, **kw):
        self.calls.append([self.tok.decode(p) for p in prompts])
        self.row = iter(range(len(prompts)))
        return super().generate(prompts, **kw)

    def reply(self, prompt):
        return f"click('{next(self.row)}')"


def test_a_batched_call_holds_its_prompts_in_job_order_whatever_the_arrival_order(agent):
    # the workers' resets take random times, so the prompts arrive in another order each run; the
    # rows (and so which episode gets which sample of a seeded generation) follow the jobs
    _, tok = agent
    gen = RowReplies(tok)
    pool = EnvPool(SlowToOpenPage, tok, num_envs=8)
    seeds = list(range(8))
    try:
        trajs, stats = rollout(gen, tok, pool, [("fake", s) for s in seeds], linger=10.0, gen_batch=8)
    finally:
        pool.close()
    assert stats["generate_calls"] == 1
    assert [re.search(r"page (\d+)", p).group(1) for p in gen.calls[0]] == [str(s) for s in seeds]
    assert [t["turns"][0]["response"] for t in trajs] == [f"click('{k}')" for k in range(8)]


def test_rollout_metrics_count_parse_errors_missing_bids_and_repeats():
    from trajectory_metrics import repeated_actions, rollout_metrics

    def turn(action, page="[12] button 'A'\n[13] checkbox 'B'", error=""):
        return {"action": action, "observation": page, "error": error, "response": action or "?"}

    loop = {"env_error": False, "success": False, "steps": 5, "turns": [
        turn("click('13')"), turn("click('13')"), turn("click('13')"), turn(None, error="not an action"),
        turn("click('77')")]}
    done = {"env_error": False, "success": True, "steps": 2, "turns": [turn("click('13')"), turn("click('12')")]}
    broken = {"env_error": True, "success": False, "steps": 1, "turns": [turn("click('12')"), turn("click('12')")]}
    assert repeated_actions(loop) == [True, True, False, False]  # an unparsed turn is no repeat, nor what follows it
    m = rollout_metrics([loop, done, broken], {})
    assert m["rollout/repeated_action"] == 2 / 5  # 4 + 1 turns after a first; the env_error episode left out
    assert m["rollout/parse_error"] == 1 / 7 and m["rollout/missing_bid"] == 1 / 7
    assert m["rollout/success"] == 0.5 and m["env/env_error"] == 1 / 3


def test_an_ungrounded_thought_names_an_element_the_page_does_not_have_at_its_bid():
    import experts
    from trajectory_metrics import rollout_metrics, ungrounded_thought

    page = "Goal: click \"Turpis\"\n[18] tab 'Tab #1', selected\n [19] link 'Tab #1'\n[26] generic 'Turpis'\n[30] textbox\n[31] button \"it's\""

    def turn(reply, action="click('19')"):
        return {"action": action, "observation": page, "error": "", "response": reply}
    # the expert's own thought for every element of the page is grounded (thought_element reads thought back)
    for bid in ("18", "19", "26", "30", "31"):
        t = experts.thought(page, f"click('{bid}')")
        assert experts.thought_element(t)[2] == bid and ungrounded_thought(turn(f"<think>{t}</think>click('{bid}')", f"click('{bid}')")) is False
    assert ungrounded_thought(turn("<think>Click the link 'Turpis' [19].</think>click('19')")) is True  # the goal's name, a tab's bid
    assert ungrounded_thought(turn("<think>Click the generic 'Turpis' [19].</think>click('19')")) is True
    assert ungrounded_thought(turn("<think>Click the link 'Tab #1' [77].</think>click('77')")) is True  # no such bid
    assert ungrounded_thought(turn("<think>Click the link [19].</think>click('19')")) is True  # [19] has a name
    assert ungrounded_thought(turn("<think>Type 'x' into the textbox [30].</think>fill('30', 'x')", "fill('30', 'x')")) is False
    assert ungrounded_thought(turn("<think>Click the link 'Turpis' [26].</think>click('26')", "click('26')")) is False  # the goal's role word
    assert ungrounded_thought(turn("<think>Click the link \"Tab #1\" [19].</think>click('19')")) is False  # either quoting
    assert ungrounded_thought(turn("<think>Click the button 'it\\'s' [31].</think>click('31')", "click('31')")) is False
    assert ungrounded_thought(turn("<think>Click the link 'Tab #1' [19].</think>click('26')", action="click('26')")) is True  # acts elsewhere
    for reply in ("click('19')", "<think>the first tab</think>click('19')", "<think>Click the link 'Tab #1' [19]."):
        assert ungrounded_thought(turn(reply)) is None  # no thought in the expert's form: nothing to check
    traj = {"env_error": False, "success": False, "steps": 3, "turns": [
        turn("<think>Click the link 'Turpis' [19].</think>click('19')"), turn("<think>Click the link 'Tab #1' [19].</think>click('19')"),
        turn("click('26')")]}
    assert rollout_metrics([traj], {})["rollout/ungrounded_thought"] == 1 / 2  # of the two turns with a thought


def test_the_grounded_reward_pays_a_success_only_when_every_thought_is_grounded(capsys):
    import train
    from trajectory_metrics import grounded, rollout_metrics, shape_rewards

    page = "[19] link 'Tab #1'\n[23] link 'Tab #3'\n[26] generic 'Turpis'"

    def episode(success, *replies, env_error=False):
        turns = [{"action": r.split("</think>")[-1], "observation": page, "error": "", "response": r} for r in replies]
        return {"task": "t", "seed": 0, "success": success, "reward": float(success), "env_error": env_error,
                "steps": len(turns), "turns": turns}
    good = episode(True, "<think>Click the link 'Tab #3' [23].</think>click('23')", "<think>Click the generic 'Turpis' [26].</think>click('26')")
    copied = episode(True, "<think>Click the link 'Turpis' [23].</think>click('23')", "<think>Click the generic 'Turpis' [26].</think>click('26')")
    bare = episode(True, "click('26')")  # no thought: no way around the check
    failed = episode(False, "<think>Click the link 'Turpis' [19].</think>click('19')")
    broken = episode(True, "<think>Click the link 'Turpis' [19].</think>click('19')", env_error=True)
    assert [grounded(t) for t in (good, copied, bare)] == [True, False, False]
    answer = episode(True, "<think>Click the generic 'Turpis' [26].</think>click('26')", "<think>Next: send msg to user.</think>send_msg_to_user('done')")
    assert grounded(answer)  # an action without a bid has no element to name: it passes
    trajs = [good, copied, bare, failed, broken]
    assert shape_rewards(trajs, "success") == 0 and [t["reward"] for t in trajs] == [1, 1, 1, 0, 1]
    assert shape_rewards(trajs, "grounded") == 2 and [t["reward"] for t in trajs] == [1, 0, 0, 0, 1]
    assert [t["success"] for t in trajs] == [True, True, True, False, True]  # success itself is never changed
    assert rollout_metrics(trajs, {"ungrounded_successes": 2})["rollout/ungrounded_success"] == 2 / 4
    with pytest.raises(ValueError, match="unknown reward"):
        shape_rewards(trajs, "shaped")
    assert train.parse_args(["--mode", "real", "--reward", "grounded"]).reward == "grounded"
    for argv in (["--mode", "real", "--reward", "grounded", "--no-think"], ["--mode", "bc", "--reward", "grounded"]):
        with pytest.raises(SystemExit):
            train.parse_args(argv)
        assert "--reward grounded applies to --mode real with --think" in capsys.readouterr().err
