"""The rollout's speed and fault tolerance with real browsers, for bench.py (its CLI runs these).

    rows, prompts = rollout_throughput(model, tok, jobs_for(tasks, 8), [1, 2, 4, 8], max_steps=6)
    bench_workers(...)    # threads vs processes; bench_chaos(...): browsers killed mid-episode;
    bench_dreams(...)     # imagined steps/s (Δ at batch 1, then batched) against real browser steps/s
"""
from __future__ import annotations

import functools
import queue
import random
import sys
import threading
import time

import compress
import env as webenv
import experts
import generators
import policy
import watchdog
from compress import PromptSettings
from rollout import EnvPool, EnvProcess, rollout

# how every bench rollout prompts the policy, and its reply budget: bench.py sets them to the checkpoint's
# (use_prompt), as eval.py would prompt it
PROMPT, MAX_NEW_TOKENS = PromptSettings(), 32


def use_prompt(settings: PromptSettings, max_new_tokens: int) -> None:
    """Prompt every later bench rollout with `settings`, replies of at most `max_new_tokens` tokens."""
    global PROMPT, MAX_NEW_TOKENS
    PROMPT, MAX_NEW_TOKENS = settings, max_new_tokens


def log(*a):
    print(*a, file=sys.stderr, flush=True)


class ExpertReplies:
    """A generator (generators.py's contract) with no model: the reply to each prompt is the scripted
    expert's action for the page that ends it (a random valid action where the expert cannot read
    the page), so a rollout's speed is its environments'."""

    def __init__(self, tok):
        self.tok, self.rng = tok, random.Random(0)

    def generate(self, prompts, **kw):
        import re

        from transitions import random_action

        out = []
        for p in prompts:
            text = self.tok.decode(p).rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>")[0]
            m = re.match(r"Goal: (.*?)\nURL: (\S*)\n(.*?)(?:\nLast action error: .*)?\Z", text, re.S)
            obs = webenv.Obs(m[1], m[2], m[3]) if m else webenv.Obs("", "", "")
            try:
                reply = experts.expert_action(obs.url.rsplit("/", 1)[-1].removesuffix(".html"), obs, self.rng)
            except Exception:
                reply = random_action(obs, self.rng)
            ids = compress.encode_reply(self.tok, reply)
            out.append(policy.Sample(ids=ids, logprobs=[0.0] * len(ids), text=reply))
        return out


def jobs_for(tasks, n_per_task, offset=0):
    seeds = webenv.eval_seeds(offset + n_per_task)[offset:]
    return [(t, s) for s in seeds for t in tasks]


def rollout_throughput(model, tok, jobs, ns, max_steps, processes=False, gen_batch=None):
    """Environment steps per second and trajectories per minute of full rollouts for each N, on the same
    jobs (threads, or env processes), generating in batches of gen_batch (default max(ns)); also the
    prompts of the largest N."""
    rows, prompts = [], []
    for n in ns:
        workers = EnvPool(functools.partial(webenv.WebEnv, max_steps=max_steps), tok, num_envs=n,
                             processes=processes)
        try:
            rollout(generators.HFGenerator(model, tok), tok, workers, jobs[:n], temperature=1.0, prompt=PROMPT, max_new_tokens=MAX_NEW_TOKENS)  # warm up: launch the browsers
            t0 = time.perf_counter()
            trajs, st = rollout(generators.HFGenerator(model, tok), tok, workers, jobs, temperature=1.0, prompt=PROMPT, max_new_tokens=MAX_NEW_TOKENS, gen_batch=gen_batch or max(ns))
            wall = time.perf_counter() - t0
        finally:
            workers.close()
        if n == max(ns):
            prompts = [u["prompt_ids"] for t in trajs for u in t["turns"]]
        rows.append({"N": n, "episodes": len(trajs), "env_steps": int(st.get("env_steps", 0)), "wall_s": wall,
                     "steps_per_s": st.get("env_steps", 0) / wall, "traj_per_min": 60 * len(trajs) / wall,
                     "generate_s": st.get("generate_s", 0.0), "env_s": st.get("env_s", 0.0),
                     "mean_batch": st.get("env_steps", 0) / max(1, st.get("generate_calls", 1)),
                     "success": sum(t["success"] for t in trajs) / max(1, len(trajs)),
                     "env_error": sum(t["env_error"] for t in trajs)})
        log(f"N={n}{' (processes)' if processes else ''}: {rows[-1]['steps_per_s']:.2f} steps/s, "
            f"{rows[-1]['traj_per_min']:.1f} traj/min")
    return rows, prompts


def bench_rollout(model, tok, tasks, ns, episodes_per_task, max_steps):
    """Environment steps per second and trajectories per minute for each N, on the same jobs."""
    rows, prompts = rollout_throughput(model, tok, jobs_for(tasks, episodes_per_task), ns, max_steps)
    # the ceiling: the same prompts through generation alone, no browser, batched like the largest N
    t0 = time.perf_counter()
    samples = policy.generate(model, tok, prompts, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, batch_size=max(ns))
    gen_wall = time.perf_counter() - t0
    ceiling = {"prompts": len(prompts), "wall_s": gen_wall, "steps_per_s": len(prompts) / gen_wall,
               "tokens_per_s": sum(len(s.ids) for s in samples) / gen_wall}
    # batched generation against one prompt at a time, on the same prompts
    few = prompts[:16]
    t0 = time.perf_counter()
    one = [policy.generate(model, tok, [p], max_new_tokens=MAX_NEW_TOKENS, temperature=1.0)[0] for p in few]
    t_one = time.perf_counter() - t0
    t0 = time.perf_counter()
    many = policy.generate(model, tok, few, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, batch_size=16)
    t_many = time.perf_counter() - t0
    gen = {"one_at_a_time_tok_s": sum(len(s.ids) for s in one) / t_one,
           "batched_16_tok_s": sum(len(s.ids) for s in many) / t_many}
    return rows, ceiling, gen


def env_throughput(jobs, n, max_steps, processes):
    """Env steps per second and episodes per minute of `n` environments stepping at once, with no language
    model: n driver threads each hold one env (a WebEnv in the thread, or an EnvProcess) and act with the
    scripted expert (experts.expert_action, seeded per episode; noop() where it has no answer)."""
    make = functools.partial(webenv.WebEnv, max_steps=max_steps)
    todo = queue.Queue()
    for job in jobs:
        todo.put(job)
    ready = threading.Barrier(n + 1)  # every browser launched before the clock starts
    done, lock = [], threading.Lock()

    def episode(env, task, seed):
        obs, rng = env.reset(seed, task=task), random.Random(seed)
        steps, end, info = 0, obs.env_error, {"env_error": obs.env_error}
        while not end:
            try:
                action = experts.expert_action(task, obs, rng)
            except Exception:
                action = "noop()"
            obs, _, end, info = env.step(action)
            steps += 1
        return steps, bool(info.get("success")), bool(info.get("env_error"))

    def drive():
        env = None
        try:
            env = EnvProcess(make, jobs[0][0]) if processes else make(jobs[0][0])
            episode(env, *jobs[0])
            ready.wait()
            while True:
                try:
                    task, seed = todo.get_nowait()
                except queue.Empty:
                    break
                result = episode(env, task, seed)
                with lock:
                    done.append((time.perf_counter(), *result))
        except BaseException:
            ready.abort()  # the clock never starts: bench fails with BrokenBarrierError, not a hang
            raise
        finally:
            if env is not None:
                env.close()
    threads = [threading.Thread(target=drive, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    ready.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = max(d[0] for d in done) - t0
    steps = sum(d[1] for d in done)
    row = {"N": n, "workers": "process" if processes else "thread", "episodes": len(done), "env_steps": steps,
           "wall_s": wall, "steps_per_s": steps / wall, "episodes_per_min": 60 * len(done) / wall,
           "success": sum(d[2] for d in done) / max(1, len(done)), "env_error": sum(d[3] for d in done)}
    log(f"env only, N={n}, {row['workers']} workers: {row['steps_per_s']:.2f} steps/s, {row['episodes_per_min']:.1f} episodes/min")
    return row


def bench_workers(model, tok, tasks, ns, episodes_per_task, max_steps, env_only=False):
    """Threads vs processes (rollout.EnvPool(processes=...)) on the same jobs for each N: the
    environments alone (scripted expert), then full rollouts with the policy. Modes alternate per N,
    so a drift in the machine's load hits both alike."""
    jobs = jobs_for(tasks, episodes_per_task)
    env_rows = [env_throughput(jobs, n, max_steps, p) for n in ns for p in (False, True)]
    rollout_rows = []
    if not env_only:
        for n in ns:
            for p in (False, True):
                rows, _ = rollout_throughput(model, tok, jobs, [n], max_steps, processes=p, gen_batch=max(ns))
                rollout_rows += [dict(r, workers="process" if p else "thread") for r in rows]
    return env_rows, rollout_rows


def bench_dreams(model, tok, wm_path, data, n, episodes, dream_len, wm_max_new_tokens):
    """Imagined steps per second (rollout.py on world_model.DreamEnv: Δ at batch 1 behind a lock, then
    batched by a DeltaServer) against real browser steps per second (env.WebEnv), with the same
    replies, N environments, the same jobs (episodes of at most dream_len steps; a dream starts from
    a start state of `data`, a real episode from the task's first page). The replies come from
    `model` (a policy) or, when it is None, from the scripted expert (ExpertReplies: the
    environments' speed alone). Browsers launch before the clock starts."""
    import world_model
    from transitions import load_transitions, start_states

    states = start_states(load_transitions(data))
    tasks = sorted({s["task"] for s in states})
    jobs = jobs_for(tasks, max(1, episodes // len(tasks)))
    if wm_path:
        world_model.check_delta_format(wm_path)  # a checkpoint of the other Δ format would dream garbage
    wm, wm_tok = policy.load_model(wm_path or policy.DEFAULT_MODEL)
    rows = []

    gen = generators.HFGenerator(model, tok) if model is not None else ExpertReplies(tok)

    def measure(name, pool, server=None):
        try:
            if server is None and "real" in name:
                rollout(gen, tok, pool, jobs[:n], temperature=1.0, prompt=PROMPT, max_new_tokens=MAX_NEW_TOKENS)  # warm up: launch the browsers
            t0 = time.perf_counter()
            trajs, st = rollout(gen, tok, pool, jobs, temperature=1.0, prompt=PROMPT, max_new_tokens=MAX_NEW_TOKENS, gen_batch=n)
            wall = time.perf_counter() - t0
        finally:
            pool.close()
            if server is not None:
                server.close()
        row = {"mode": name, "N": n, "episodes": len(trajs), "steps": int(st.get("env_steps", 0)), "wall_s": wall,
               "steps_per_s": st.get("env_steps", 0) / wall, "policy_generate_s": st.get("generate_s", 0.0),
               "env_s": st.get("env_s", 0.0), "env_error": sum(t["env_error"] for t in trajs)}
        if server is not None:
            row["wm_mean_batch"] = server.stats["requests"] / max(1, server.stats["calls"])
        rows.append(row)
        log(f"{name}: {row['steps']} steps in {wall:.1f} s, {row['steps_per_s']:.2f} steps/s")

    measure("real browser", EnvPool(functools.partial(webenv.WebEnv, max_steps=dream_len), tok, num_envs=n))
    # (a dream step waits behind up to N - 1 others' generations: no watchdog on this CPU-bound wait)
    measure("dream, Δ at batch 1", EnvPool(lambda task: world_model.DreamEnv(
        wm, wm_tok, states, dream_len, max_new_tokens=wm_max_new_tokens), tok, num_envs=n, step_timeout=3600))
    server = world_model.DeltaServer(wm, wm_tok, max_new_tokens=wm_max_new_tokens, max_batch=n)
    measure("dream, Δ batched", EnvPool(lambda task: world_model.DreamEnv(
        wm, wm_tok, states, dream_len, server=server), tok, num_envs=n, step_timeout=3600), server)
    return rows


def bench_chaos(model, tok, tasks, episodes_per_task, max_steps, num_envs, kill_share=0.1, seed=0):
    """Kill a random tenth of the browsers during a rollout; count what completes and what is lost."""
    jobs = jobs_for(tasks, episodes_per_task, offset=100)
    workers = EnvPool(lambda task: webenv.WebEnv(task, max_steps=max_steps), tok, num_envs=num_envs)
    rng = random.Random(seed)
    n_kill = max(1, round(kill_share * len(jobs)))
    killed = []
    stop = threading.Event()

    def killer():
        while not stop.is_set() and len(killed) < n_kill:
            time.sleep(rng.uniform(0.5, 2.0))
            w = rng.choice(workers.workers)
            env, current = w.env, w.current
            # mid-episode (after at least one step): a kill during reset is retried by WebEnv itself
            if env is not None and current is not None and current[2]["turns"]:
                pids = watchdog.chromium_pids(env.marker)
                watchdog.sigkill(pids)
                if pids:
                    killed.append(env.marker)
    k = threading.Thread(target=killer, daemon=True)
    k.start()
    t0 = time.perf_counter()
    try:
        trajs, st = rollout(generators.HFGenerator(model, tok), tok, workers, jobs, temperature=1.0, prompt=PROMPT, max_new_tokens=MAX_NEW_TOKENS)
    finally:
        stop.set()
        workers.close()
    return {"episodes": len(jobs), "browsers_killed": len(killed),
            "completed": sum(1 for t in trajs if t is not None and not t["env_error"]),
            "env_error": sum(1 for t in trajs if t is not None and t["env_error"]),
            "lost": sum(1 for t in trajs if t is None), "wall_s": round(time.perf_counter() - t0, 1)}
