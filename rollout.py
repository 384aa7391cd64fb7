"""Trajectory collection: run the policy in environments and return trajectory records.

This is the simple synchronous version: up to `num_envs` episodes run at once in lock step.
Each round, every episode that waits for an action gets its prompt built (compress.py), one
batched `generate` call serves all of them, then each environment steps in turn. Episodes that
finish are replaced by the next job, so a short episode frees its slot for the next one.

Any environment with the WebEnv interface works: `reset(seed) -> Obs` and
`step(text) -> (Obs, reward, done, info)`, real pages (env.py) or, later, dreams.

Trajectory record (DESIGN.md): {task, seed, goal, source, turns: [{prompt_ids, response_ids,
response_logprobs, observation, response, action, error}], reward, success, env_error, steps}.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Callable

from tqdm import tqdm

import compress
import policy


class EnvPool:
    """Environments kept alive between episodes (a browser launch costs about a second).

    `make_env(task)` builds one; at most `max_envs` live at once, idle ones of other tasks are
    closed first when the pool is full.
    """

    def __init__(self, make_env: Callable, max_envs: int = 16):
        self.make_env, self.max_envs = make_env, max_envs
        self.idle: dict[str, list] = defaultdict(list)
        self.busy = 0

    def acquire(self, task: str):
        if self.idle[task]:
            env = self.idle[task].pop()
        else:
            while self.busy + sum(map(len, self.idle.values())) >= self.max_envs:
                victim = next((t for t, envs in self.idle.items() if envs), None)
                if victim is None:
                    break
                self.idle[victim].pop().close()
            env = self.make_env(task)
        self.busy += 1
        return env

    def release(self, task: str, env):
        self.busy -= 1
        self.idle[task].append(env)

    def close(self):
        for envs in self.idle.values():
            for env in envs:
                env.close()
        self.idle.clear()


def rollout(model, tokenizer, pool: EnvPool, jobs: list[tuple[str, int]], *, num_envs: int = 8,
            temperature: float = 1.0, max_new_tokens: int = 32, keep_last: int = 1, compress_context: bool = True,
            max_prompt_tokens: int = 1024, system: str = compress.SYSTEM_PROMPT, gen_batch: int = 16,
            bf16: bool = False, source: str = "real", progress: bool = False, desc: str = "rollout") -> tuple[list[dict], dict]:
    """Run one episode per job (task, seed) and return (trajectories in job order, stats).

    The episode length limit is the environment's. stats: generate/env seconds and counts
    (`env_steps` is the number of real browser steps taken, for comparing runs at equal
    real experience).
    """
    results: list[dict | None] = [None] * len(jobs)
    queue = list(enumerate(jobs))[::-1]
    active: list[dict] = []
    stats = defaultdict(float)
    bar = tqdm(total=len(jobs), desc=desc, disable=not progress, leave=False)

    def start_next():
        while queue and len(active) < num_envs:
            j, (task, seed) = queue.pop()
            env = pool.acquire(task)
            t0 = time.perf_counter()
            try:
                obs = env.reset(seed)
            except Exception as e:  # env.py already turns browser faults into env_error; belt and braces
                obs = None
                err = f"reset failed: {type(e).__name__}: {e}"
            stats["env_s"] += time.perf_counter() - t0
            traj = {"task": task, "seed": seed, "goal": getattr(obs, "goal", ""), "source": source, "turns": [],
                    "reward": 0.0, "success": False, "env_error": obs is None, "steps": 0}
            if obs is None or getattr(obs, "env_error", False):
                traj["env_error"] = True
                traj["error"] = err if obs is None else obs.error
                pool.release(task, env)
                results[j] = traj
                bar.update(1)
                continue
            active.append({"j": j, "env": env, "obs": obs, "traj": traj})

    start_next()
    while active:
        prompts = [compress.build_prompt(tokenizer, [{"observation": t["observation"], "response": t["response"]}
                                                     for t in ep["traj"]["turns"]], ep["obs"].text,
                                         keep_last=keep_last, compress=compress_context,
                                         max_tokens=max_prompt_tokens, system=system) for ep in active]
        t0 = time.perf_counter()
        samples = policy.generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                  temperature=temperature, batch_size=gen_batch, bf16=bf16)
        stats["generate_s"] += time.perf_counter() - t0
        stats["generated_tokens"] += sum(len(s.ids) for s in samples)
        stats["prompt_tokens"] += sum(map(len, prompts))
        still = []
        for ep, prompt, s in zip(active, prompts, samples):
            t0 = time.perf_counter()
            obs, reward, done, info = ep["env"].step(s.text)
            stats["env_s"] += time.perf_counter() - t0
            stats["env_steps"] += 1
            traj = ep["traj"]
            traj["turns"].append({"prompt_ids": prompt, "response_ids": s.ids, "response_logprobs": s.logprobs,
                                  "observation": ep["obs"].text, "response": s.text,
                                  "action": info.get("action"), "error": info.get("error", ""),
                                  "truncated": s.truncated})
            traj["steps"] += 1
            if done:
                traj["reward"] = float(reward)
                traj["success"] = bool(info.get("success", reward >= 1.0))
                traj["env_error"] = bool(info.get("env_error", False))
                pool.release(traj["task"], ep["env"])
                results[ep["j"]] = traj
                bar.update(1)
            else:
                ep["obs"] = obs
                still.append(ep)
        active[:] = still
        start_next()
    bar.close()
    return results, dict(stats)
