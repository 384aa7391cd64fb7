"""Asynchronous trajectory collection (WebAgent-R1, Sec. 3.3): many browsers, one batched generator.

Each of `num_envs` worker threads owns one environment (Playwright's sync API is bound to the
thread that created it) and runs whole episodes: reset, then for every turn it builds the prompt
(compress.py), hands it to the generator and waits for the reply, then steps the page. The main
thread is the generator: it gathers every agent that is waiting for an action into one batched
`generate` call, so a slow page or a long trajectory never holds up the others and the browsers'
work overlaps generation.

A step that raises or hangs past `step_timeout` seconds ends that episode as `env_error`: its
worker is abandoned (its browser killed) and a fresh worker with a fresh environment takes its
slot; no other trajectory is lost. Any environment with the WebEnv interface works, real pages
(env.py) or dreams (world_model.DreamEnv): `reset(seed, task=...) -> Obs`,
`step(text) -> (Obs, reward, done, info)`, `close()`.

EnvPool(..., processes=True) moves each environment into a child process of its own
(EnvProcess): the worker threads, the prompts and the batched generation stay here, and only
reset/step/close travel over a Pipe. Threads share one interpreter (and its GIL) among every
Playwright client, the page observations and the generator; processes do not, at the price of a
pickle per call and a Python process per browser. bench.py --only workers measures both.

Each episode is a records.Trajectory (records.py). An environment whose reset observation has a
`context` (world_model.DreamObs: the real episode before a dream's start page) starts the prompts'
history with it; the trajectory keeps it under `context`, apart from its turns, so no update scores
it. With an env that takes screenshots
(WebEnv(screenshots=True)), each turn also holds `screenshot` (base64 JPEG of the page the agent
acted on) and the trajectory `final_screenshot` (the last page); the keys are absent otherwise.

Faults end one episode, never the rollout: an exception anywhere in a worker (the environment, the
prompt, the record) or in the generator ends the episodes concerned as `env_error` with the error's
text, and the others go on.
"""
from __future__ import annotations

import base64
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from tqdm import tqdm

from compress import PromptSettings
from records import Trajectory, new_trajectory


@dataclass
class _Request:
    """One agent's prompt, waiting for the generator; the reply comes back on `reply`: a
    policy.Sample, None (the rollout is over) or an Exception (generation failed)."""
    prompt: list[int]
    job: int = 0  # the episode's index in the rollout's jobs: its row in a batched call
    reply: "queue.Queue" = field(default_factory=lambda: queue.Queue(maxsize=1))


class _Worker(threading.Thread):
    """One environment in one thread, running the episodes it is handed."""

    def __init__(self, pool: "EnvPool", wid: int):
        super().__init__(daemon=True, name=f"env-worker-{wid}")
        self.pool, self.wid = pool, wid
        self.env = None
        self.abandoned = False
        self.step_started: float | None = None  # when the current reset/step began (watchdog)
        self.current: tuple | None = None  # (rollout call, job index, trajectory) being collected

    def run(self):
        while not self.abandoned:  # an abandoned worker must not take a job on its way out: it would be lost
            item = self.pool.jobs.get()
            if item is None:
                break
            if self.abandoned:  # (abandonment happens during a step, so this is only a safety net)
                self.pool.jobs.put(item)
                break
            call, j, task, seed = item
            try:
                traj = self.episode(call, j, task, seed)
            except Exception as e:  # the prompt, the record, the generator: this episode ends, the worker goes on
                traj = self.current[2] if self.current else new_trajectory(task, seed, call.source)
                traj.update(env_error=True, error=f"worker error: {type(e).__name__}: {e}")
            self.current = None
            if not self.abandoned:
                call.finish(j, traj)
        if self.env is not None and not self.abandoned:
            self.env.close()

    def _timed(self, fn, *a):
        """Call fn, visible to the watchdog while it runs."""
        self.step_started = time.perf_counter()
        try:
            return fn(*a)
        finally:
            self.step_started = None

    def episode(self, call: "_RolloutCall", j: int, task: str, seed: int) -> Trajectory:
        """One whole episode of `task` on page `seed`. Environment faults end it as env_error here;
        any other exception propagates to run(), which does the same."""
        traj = new_trajectory(task, seed, call.source)
        self.current = (call, j, traj)
        t0 = time.perf_counter()
        try:
            # A browser (re)launch waits for one of pool.launches slots (see EnvPool). A launch that
            # hangs keeps its slot until the watchdog kills it; the wait for a slot is bounded all the
            # same, so launches can never stall the pool.
            launch = self.env is None or getattr(self.env, "needs_launch", False)
            gated = launch and self.pool.launching.acquire(timeout=self.pool.step_timeout)
            t0 = time.perf_counter()  # (env_s counts the launch, not the wait for a slot)
            try:
                if self.env is None:
                    self.env = self.pool.new_env(task)
                obs = self._timed(lambda: self.env.reset(seed, task=task))
            finally:
                if gated:
                    self.pool.launching.release()
            if self.abandoned:  # the watchdog has already ended this episode: leave its record alone
                return traj
        except Exception as e:  # env.py turns browser faults into env_error itself; this is the backstop
            if self.abandoned:
                return traj
            traj.update(env_error=True, error=f"reset failed: {type(e).__name__}: {e}")
            if self.env is not None:
                self.env.close()
            self.env = None
            return traj
        finally:
            call.add("env_s", time.perf_counter() - t0)
        traj["goal"] = getattr(obs, "goal", "")
        if getattr(obs, "env_error", False):  # the browser could not load the page: no step is taken
            traj.update(env_error=True, error=obs.error)
            return traj
        # a dream's real episode so far (DreamObs.context): prompt history, never a trained turn
        context = [{"observation": u["observation"], "response": u["response"]} for u in getattr(obs, "context", ())]
        if context:
            traj["context"] = context
        while True:
            history = context + [{"observation": u["observation"], "response": u["response"]} for u in traj["turns"]]
            prompt = call.settings.build(self.pool.tokenizer, history, obs.text)
            req = _Request(prompt, j)
            call.requests.put(req)
            sample = req.reply.get()
            if sample is None or self.abandoned:  # the rollout was cancelled
                return traj
            if isinstance(sample, Exception):
                raise sample
            t0 = time.perf_counter()
            try:
                obs_next, reward, done, info = self._timed(self.env.step, sample.text)
            except Exception as e:
                obs_next, reward, done = obs, 0.0, True
                info = {"env_error": True, "error": f"{type(e).__name__}: {e}", "action": None}
            if self.abandoned:  # the watchdog already ended this episode as env_error
                return traj
            call.add("env_s", time.perf_counter() - t0)
            call.add("env_steps", 1)
            traj["turns"].append({"prompt_ids": prompt, "response_ids": sample.ids,
                                  "response_logprobs": sample.logprobs, "observation": obs.text,
                                  "response": sample.text, "action": info.get("action"),
                                  "error": info.get("error", ""), "truncated": sample.truncated})
            if sample.entropy is not None:
                traj["turns"][-1]["entropy"] = sample.entropy
            _add_screenshot(traj["turns"][-1], "screenshot", obs)
            traj["steps"] += 1
            if done:
                _add_screenshot(traj, "final_screenshot", obs_next)
                traj["final_observation"] = obs_next.text  # the page after the last action (judge.py reads it)
                traj["reward"] = float(reward)
                traj["success"] = bool(info.get("success", reward >= 1.0))
                traj["env_error"] = bool(info.get("env_error", False))
                if traj["env_error"]:
                    traj["error"] = info.get("error", "")
                return traj
            obs = obs_next


def _add_screenshot(record: dict, key: str, obs) -> None:
    """record[key] = the Obs's screenshot as base64 text (JSON-serialisable), only when it has one."""
    shot = getattr(obs, "screenshot", None)
    if shot:
        record[key] = base64.b64encode(shot).decode("ascii")


class _RolloutCall:
    """The state of one rollout() call: its jobs' results, the agents waiting for a reply, counters."""

    def __init__(self, n: int, source: str, settings: PromptSettings):
        self.results: list[dict | None] = [None] * n
        self.done = 0
        self.source, self.settings = source, settings
        self.requests: "queue.Queue[_Request]" = queue.Queue()
        self.stats = defaultdict(float)
        self.lock = threading.Lock()
        self.finished = threading.Event()
        if n == 0:
            self.finished.set()

    def add(self, key, value):
        with self.lock:
            self.stats[key] += value

    def finish(self, j: int, traj: dict):
        with self.lock:
            if self.results[j] is None:
                self.results[j] = traj
                self.done += 1
            if self.done == len(self.results):
                self.finished.set()
        self.requests.put(None)  # wake the generator so that it sees the progress


class EnvPool:
    """`num_envs` long-lived worker threads, each owning one environment built by `make_env(task)`.

    Keep one for the whole run: browsers then launch once, not once per rollout. `close()` ends
    the threads and their browsers. processes=True: each environment lives in a child process
    (EnvProcess), so `make_env` must be picklable: a top-level function or class, or
    functools.partial(env.WebEnv, max_steps=...), not a lambda (TypeError otherwise).
    """

    def __init__(self, make_env: Callable, tokenizer, num_envs: int = 8, step_timeout: float = 60.0,
                 processes: bool = False):
        if processes:
            try:
                pickle.dumps(make_env)
            except Exception as e:
                raise TypeError(f"processes=True needs a picklable make_env (a top-level function or "
                                f"functools.partial(env.WebEnv, ...)), got {make_env!r}: {e}") from None
        self.make_env, self.tokenizer, self.step_timeout = make_env, tokenizer, step_timeout
        self.processes = processes
        self.env_attrs: dict = {}  # set on every environment (set_env_attr)
        self.jobs: "queue.Queue" = queue.Queue()
        # Browsers launch a few at a time: 16 Chromiums starting at once on 2 cores crashed their pages
        # and ran past the reset deadline, every one of them, again at each relaunch (measured);
        # two at a time launched all 16 in 22 s.
        self.launches = max(2, len(os.sched_getaffinity(0)) // 2)
        self.launching = threading.Semaphore(self.launches)
        self.workers = [self._spawn(i) for i in range(num_envs)]

    def _spawn(self, wid: int) -> _Worker:
        w = _Worker(self, wid)
        w.start()
        return w

    def new_env(self, task: str):
        """A fresh environment for `task`, in this process or in a child one, with env_attrs set."""
        if self.processes:
            return EnvProcess(self.make_env, task, self.env_attrs)
        env = self.make_env(task)
        for name, value in self.env_attrs.items():
            setattr(env, name, value)
        return env

    def set_env_attr(self, name: str, value) -> None:
        """Set an attribute on every environment, now and to come (e.g. screenshots only in the iterations
        that write a report). Threads: at once; processes: in the child, before its next reset.
        Call it between rollouts."""
        self.env_attrs[name] = value
        if not self.processes:
            for w in self.workers:
                if w.env is not None:
                    setattr(w.env, name, value)

    def watchdog(self):
        """End episodes whose reset/step ran past step_timeout as env_error; replace their worker."""
        now = time.perf_counter()
        for k, w in enumerate(self.workers):
            started, current = w.step_started, w.current
            if started is not None and current is not None and now - started > self.step_timeout and not w.abandoned:
                w.abandoned = True
                call, j, traj = current
                traj.update(env_error=True, error=f"step timed out after {self.step_timeout:.0f} s")
                call.finish(j, traj)
                try:  # unstick the thread: its browser (or env process) dies, its call raises, the thread ends
                    kill = getattr(w.env, "kill", None) or w.env.close
                    threading.Thread(target=kill, daemon=True).start()
                except Exception:
                    pass
                self.workers[k] = self._spawn(w.wid)
                call.add("env_timeouts", 1)

    def close(self):
        for _ in self.workers:
            self.jobs.put(None)
        for w in self.workers:
            if not w.abandoned:
                w.join(timeout=30)


def _serve(conn, make_env: Callable, task: str) -> None:
    """The body of an EnvProcess child: build the env, send its marker, then answer each
    (method, args, kwargs, attrs) request with (True, result) or (False, exception) until "close"."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which then closes this env
    try:
        env = make_env(task)
    except Exception as e:
        _reply(conn, False, e)
        return
    _reply(conn, True, getattr(env, "marker", None))
    while True:
        try:
            method, args, kwargs, attrs = conn.recv()
        except EOFError:  # the parent is gone
            method, args, kwargs, attrs = "close", (), {}, {}
        for name, value in attrs.items():
            setattr(env, name, value)
        try:
            ok, value = True, getattr(env, method)(*args, **kwargs)
        except Exception as e:
            ok, value = False, e
        _reply(conn, ok, value)
        if method == "close":
            return


def _reply(conn, ok: bool, value) -> None:
    try:
        conn.send((ok, value))
    except OSError:  # the parent is gone
        pass
    except Exception as e:  # an exception that does not pickle: send its text
        conn.send((False, RuntimeError(f"{type(value).__name__}: {value} (unpicklable: {e})")))


class EnvProcess:
    """An environment that lives in a child process, with the WebEnv interface: reset, step, close, kill.

    The child is forked from multiprocessing's forkserver (never from this process, whose Playwright
    may be running), builds `make_env(task)` (a picklable factory) and answers over a Pipe; Obs,
    rewards, infos and exceptions come back pickled. `attrs` (a dict, e.g. {"screenshots": True}) is
    set on the child's env before every reset. `marker` is the env's Chromium tag (WebEnv.marker).
    Errors: whatever the env's method raised, re-raised here; RuntimeError when the child died
    (killed, crashed) or did not start within START_TIMEOUT_S. After the child died, the next reset
    starts a fresh one; kill() ends the child and its browser at once, from any thread.
    As with any multiprocessing start method but fork, the main script must be importable without
    side effects (`if __name__ == "__main__":`): the forkserver imports it once.
    """
    START_TIMEOUT_S = 120.0  # forkserver start + the child's imports + make_env, on busy cores
    CLOSE_TIMEOUT_S = 30.0   # for the env's own close() (WebEnv: 10 s), then the child is killed

    def __init__(self, make_env: Callable, task: str, attrs: dict | None = None):
        self.make_env, self.task, self.attrs = make_env, task, attrs if attrs is not None else {}
        self._start()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["__main__", "env"])  # imported once, in the server, not in every child
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, self.make_env, self.task), daemon=True,
                                name=f"env-{self.task}")
        self.proc.start()
        child.close()
        self.marker = None
        self.marker = self._recv(self.START_TIMEOUT_S)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def needs_launch(self) -> bool:
        """The child died: the next reset starts a fresh one (and its browser). A browser that dies
        inside a live child relaunches there, outside the pool's launch limit."""
        return not self.proc.is_alive()

    def _recv(self, timeout: float | None = None):
        try:
            if timeout is not None and not self.conn.poll(timeout):
                raise TimeoutError(f"no answer within {timeout:g} s")
            ok, value = self.conn.recv()
        except (EOFError, OSError) as e:  # OSError: the pipe broke or a timeout
            self.kill()
            raise RuntimeError(f"the environment process {self.proc.pid} died or hung "
                               f"(exit code {self.proc.exitcode}): {type(e).__name__}: {e}") from None
        if not ok:
            raise value
        return value

    def _call(self, method: str, *args, timeout: float | None = None, attrs: dict | None = None, **kwargs):
        try:
            self.conn.send((method, args, kwargs, dict(attrs or {})))
        except OSError:
            pass  # the child is gone: _recv says so
        return self._recv(timeout)

    def reset(self, seed: int, task: str | None = None):
        if self.needs_launch:  # it died since the last call: a fresh child
            self.kill()
            self._start()
        return self._call("reset", seed, task=task, attrs=self.attrs)

    def step(self, text: str):
        return self._call("step", text)

    def close(self) -> None:
        """Close the env and end the child (killed past CLOSE_TIMEOUT_S). Never raises."""
        if self.proc.is_alive():
            try:
                self._call("close", timeout=self.CLOSE_TIMEOUT_S)
            except Exception:
                pass
            self.proc.join(timeout=5)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the env's Chromium (found by its marker) and the child process; reap the child."""
        if self.marker:
            import watchdog  # (only WebEnv has a marker)

            watchdog.sigkill(watchdog.chromium_pids(self.marker))
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)


def rollout(generator, tokenizer, pool: EnvPool, jobs: list[tuple[str, int]], *, temperature: float = 1.0,
            max_new_tokens: int = 32, prompt: PromptSettings = PromptSettings(), gen_batch: int = 16,
            source: str = "real", progress: bool = False, desc: str = "rollout",
            linger: float = 0.02) -> tuple[list[Trajectory], dict]:
    """Run one episode per job (task, seed) on the pool; return (trajectories in job order, stats).

    generator: a policy generator (generators.py: `generate(prompts, ...) -> [Sample]`); every
    waiting agent's prompt goes into one batched call, after waiting at most `linger` seconds
    beyond the first for others to join. A generator that raises ends the episodes of that call
    as env_error. stats (summed over workers): generate_s, env_s, env_steps (environment steps),
    generated_tokens, prompt_tokens, generate_calls, env_timeouts, wall_s.
    """
    call = _RolloutCall(len(jobs), source, prompt)
    for j, (task, seed) in enumerate(jobs):
        pool.jobs.put((call, j, task, seed))
    bar = tqdm(total=len(jobs), desc=desc, disable=not progress, leave=False)
    t_start = time.perf_counter()
    while not call.finished.is_set():
        try:
            first = call.requests.get(timeout=1.0)
        except queue.Empty:
            first = None
        pending = [first] if first is not None else []
        deadline = time.perf_counter() + linger
        while pending and len(pending) < gen_batch:  # (a wake-up with no request waits for nothing)
            try:
                r = call.requests.get(timeout=max(0.0, deadline - time.perf_counter()))
            except queue.Empty:
                break
            if r is not None:
                pending.append(r)
        bar.n = call.done
        bar.refresh()
        if pending:
            # rows in job order, not arrival order: which episode gets which sample of a seeded
            # generation does not depend on thread timing (one call holding the same requests samples
            # the same replies for the same episodes)
            pending.sort(key=lambda r: r.job)
            t0 = time.perf_counter()
            try:
                samples = generator.generate([r.prompt for r in pending], max_new_tokens=max_new_tokens,
                                             temperature=temperature, batch_size=gen_batch)
                if len(samples) != len(pending):
                    raise RuntimeError(f"the generator returned {len(samples)} replies for {len(pending)} prompts")
            except Exception as e:  # these agents' episodes end as env_error; the rollout goes on
                samples = [RuntimeError(f"generation failed: {type(e).__name__}: {e}")] * len(pending)
            call.add("generate_s", time.perf_counter() - t0)
            call.add("generated_tokens", sum(len(s.ids) for s in samples if not isinstance(s, Exception)))
            call.add("prompt_tokens", sum(len(r.prompt) for r in pending))
            call.add("generate_calls", 1)
            for r, s in zip(pending, samples):
                r.reply.put(s)
        pool.watchdog()
    bar.n = call.done
    bar.close()
    stats = dict(call.stats)
    stats["wall_s"] = time.perf_counter() - t_start
    return call.results, stats
