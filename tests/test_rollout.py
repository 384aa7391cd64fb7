"""The asynchronous rollout on real Chromium with a tiny model: faults end one episode, lose none."""
import os
import signal
import threading
import time

import pytest

import env as webenv
import policy
from rollout import EnvWorkers, rollout


@pytest.fixture(scope="module")
def agent():
    tok = policy.load_tokenizer()
    return policy.tiny_model(tok), tok


def test_results_in_job_order_with_exact_token_records(agent):
    model, tok = agent
    workers = EnvWorkers(lambda task: webenv.WebEnv(task, max_steps=2), tok, num_envs=3)
    jobs = [("click-button", 10_000), ("enter-text", 10_001), ("click-link", 10_002), ("focus-text", 10_003)]
    try:
        trajs, stats = rollout(model, tok, workers, jobs, max_new_tokens=6)
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
    workers = EnvWorkers(lambda task: webenv.WebEnv(task, max_steps=3), tok, num_envs=3)
    victim = {}

    def kill_one():  # wait until a worker is mid-episode, then SIGKILL its Chromium
        deadline = time.time() + 60
        while time.time() < deadline and not victim:
            for w in workers.workers:
                if w.current is not None and w.env is not None and w.current[2]["turns"]:
                    victim["seed"] = w.current[2]["seed"]
                    w.env.kill()
                    return
            time.sleep(0.01)
    jobs = [("click-button", 10_010 + i) for i in range(6)]
    threading.Thread(target=kill_one, daemon=True).start()
    try:
        trajs, _ = rollout(model, tok, workers, jobs, max_new_tokens=6)
    finally:
        workers.close()
    assert victim, "no episode was caught mid-way"
    assert all(t is not None for t in trajs)  # nothing lost
    errors = [t for t in trajs if t["env_error"]]
    assert [t["seed"] for t in errors] == [victim["seed"]]
    assert all(t["steps"] == 3 for t in trajs if not t["env_error"])  # the others ran to the step limit


def test_a_hung_browser_times_out_as_env_error(agent):
    model, tok = agent
    workers = EnvWorkers(lambda task: webenv.WebEnv(task, max_steps=3), tok, num_envs=2, step_timeout=3.0)
    frozen = {}

    def freeze_one():  # SIGSTOP a browser mid-episode: its next step hangs until the watchdog acts
        deadline = time.time() + 60
        while time.time() < deadline and not frozen:
            for w in workers.workers:
                if w.current is not None and w.env is not None and w.current[2]["turns"]:
                    frozen["seed"] = w.current[2]["seed"]
                    for pid in webenv.chromium_pids(w.env.marker):
                        os.kill(pid, signal.SIGSTOP)
                    return
            time.sleep(0.01)
    jobs = [("click-button", 10_020 + i) for i in range(4)]
    threading.Thread(target=freeze_one, daemon=True).start()
    t0 = time.time()
    try:
        trajs, stats = rollout(model, tok, workers, jobs, max_new_tokens=6)
    finally:
        workers.close()
    assert frozen and time.time() - t0 < 60
    hung = [t for t in trajs if t["env_error"]]
    assert [t["seed"] for t in hung] == [frozen["seed"]] and "timed out" in hung[0]["error"]
    assert all(t is not None for t in trajs) and stats.get("env_timeouts") == 1


class _SlowFirstStep:
    """A browser-free environment: one-step episodes of 0.2 s; the very first step hangs 2 s."""
    slept = False

    def __init__(self, task):
        self.task = task

    def reset(self, seed, task=None):
        return webenv.Obs(goal="Click OK.", url="x.html", axtree="[1] button 'OK'")

    def step(self, text):
        if not _SlowFirstStep.slept:
            _SlowFirstStep.slept = True
            time.sleep(2.0)
        time.sleep(0.2)
        return webenv.Obs(goal="Click OK.", url="x.html", axtree=""), 1.0, True, {"success": True, "env_error": False}

    def close(self):
        pass


def test_a_timed_out_worker_takes_no_job_on_its_way_out(agent):
    # The watchdog abandons the slow worker and starts a fresh one. When the abandoned thread wakes
    # up it must not take a queued job: that job would be lost and the rollout would wait forever
    # (seen in dream mode, where steps wait on the world model's lock).
    model, tok = agent
    workers = EnvWorkers(_SlowFirstStep, tok, num_envs=1, step_timeout=0.5)
    out = {}
    jobs = [("click-button", i) for i in range(12)]  # still queued when the slow step ends
    runner = threading.Thread(target=lambda: out.update(r=rollout(model, tok, workers, jobs, max_new_tokens=4)),
                              daemon=True)
    runner.start()
    runner.join(timeout=60)
    workers.close()
    assert not runner.is_alive(), "the rollout never finished: a job was lost"
    trajs, stats = out["r"]
    assert [t["env_error"] for t in trajs] == [True] + [False] * 11 and stats["env_timeouts"] == 1
