"""Speed, memory and fault tolerance of the rollout, measured on this machine (the browser-side parts
live in bench_rollout.py; this file has the CLI and the model-side parts).

    python bench.py                       # everything below, markdown tables on stdout and in runs/bench/
    python bench.py --only rollout        # rollout throughput for N = 1, 2, 4, 8 browsers + generation ceiling
    python bench.py --only compression    # prompt tokens per turn and training-step memory, with/without compression
    python bench.py --only chaos          # a rollout in which a tenth of the browsers are killed at random
    python bench.py --only padding        # BC micro-batches: padded tokens, random order vs sorted by length (no model)
    python bench.py --only generation     # a group's first turn: G identical prompts with and without a shared prefill
    python bench.py --only deltas         # Δ tokens per transition: line by line vs with `=` blocks (tokenizer only)
    python bench.py --only dreams         # imagined steps/s (Δ at batch 1, then batched) vs real browser steps/s
    python bench.py --only workers        # threads vs processes (rollout.EnvPool): env alone, then full rollouts
                                          # (only on request; --env-only skips the rollouts with the policy)
    python bench.py --only training       # judge (or --train-mode wm) training steps: s per step and peak RSS by
                                          # --micro-batch and --grad-ckpt (only on request)

The policy is a checkpoint (--ckpt, default runs/bc/final when it exists, else the base model):
a behaviour-cloned model answers in a few tokens like a trained agent does, where the base model
writes prose until the length limit. Targets (WebAgent-R1's asynchronous rollout; see the README):
N = 8 at least 3x the steps per second of N = 1; rollout throughput at least 80% of generation
alone; with compression, turn-10 prompts at most a third of the uncompressed ones.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time


import checkpoint
import compress
import env as webenv
import policy
import runlog
import supervised
from runlog import read_jsonl


from bench_rollout import bench_chaos, bench_dreams, bench_rollout, bench_workers, log, use_prompt  # noqa: E402


def delta_lengths(tok, data):
    """Δ tokens of every transition in `data`, line by line (diff(subtree=False)) and with `=` blocks."""
    import delta
    from transitions import load_transitions

    rows = []
    for t in load_transitions(data):
        status = delta.done_status(bool(t["success"]), bool(t["done"]) and not t.get("truncated"))
        n = [len(compress.encode_text(tok, delta.diff(t["obs"], t["next_obs"], status, subtree=s, action=t["action"]))) for s in (False, True)]
        rows.append({"task": t["task"], "lines": n[0], "blocks": n[1]})
    return rows


def ten_turn_history(tok):
    """A 10-turn trajectory built from real observations of the suite (expert demonstrations)."""
    path = "runs/demos.jsonl"
    obs = []
    if os.path.exists(path):
        for t in read_jsonl(path):
            obs += [(u["observation"], u["action"]) for u in t["turns"]]
            if len(obs) >= 40:
                break
    if len(obs) < 11:  # no demos yet: real pages, read now
        e = webenv.WebEnv("click-checkboxes")
        for s in webenv.train_seeds(11):
            obs.append((e.reset(s).text, "click('12')"))
        e.close()
    random.Random(0).shuffle(obs)
    return [{"observation": o, "response": a} for o, a in obs[:11]]


def bench_compression(tok, ckpt):
    """Prompt tokens at turns 1..10 and peak memory of a training step, with and without compression."""
    hist = ten_turn_history(tok)
    rows = []
    for t in range(1, 11):
        c = len(compress.build_prompt(tok, hist[:t - 1], hist[t - 1]["observation"], max_tokens=100_000))
        f = len(compress.build_prompt(tok, hist[:t - 1], hist[t - 1]["observation"], compress=False, max_tokens=100_000))
        rows.append({"turn": t, "compressed": c, "full": f})
    mem = []
    for t in (1, 5, 10):
        for mode in ("compressed", "full"):
            r = subprocess.run([sys.executable, __file__, "--_step-memory", mode, "--_turn", str(t), "--ckpt", ckpt or ""],
                               capture_output=True, text=True)
            mem.append({"turn": t, "mode": mode, **json.loads(r.stdout.strip().splitlines()[-1])})
            log(f"memory turn {t} {mode}: {mem[-1]}")
    return rows, mem


def step_memory(mode: str, turn: int, ckpt: str):
    """In a fresh process: peak RSS of one training step (forward+backward) on the turn's sample,
    and on every sample of a `turn`-turn trajectory one after another (what M-GRPO does)."""
    model, tok = policy.load_model(ckpt or policy.DEFAULT_MODEL)
    model.train()
    hist = ten_turn_history(tok)
    base = runlog.peak_rss_mb()
    prompt = compress.build_prompt(tok, hist[:turn - 1], hist[turn - 1]["observation"], compress=mode == "compressed",
                                   max_tokens=100_000)
    reply = compress.encode_reply(tok, hist[turn - 1]["response"])
    ids, mask, rm, L = policy.response_batch([prompt], [reply], tok.pad_token_id)
    t0 = time.perf_counter()
    lp = policy.token_logprobs(model, ids, mask, L)
    (-(lp * rm).sum()).backward()
    dt = time.perf_counter() - t0
    peak = runlog.peak_rss_mb()
    print(json.dumps({"prompt_tokens": len(prompt), "step_s": round(dt, 2),
                      "peak_rss_mb": round(peak), "step_extra_mb": round(peak - base)}))


TRAINING_CONFIGS = ((8, 0), (4, 0), (2, 0), (8, 1), (2, 1))  # (--micro-batch, --grad-ckpt)


def write_long_dreams(path: str, n: int = 8, turns: int = 6) -> None:
    """n labelled six-turn dreams (judge prompts of 824-874 tokens) for the training benchmark: the first
    page of tests/data/transitions.jsonl (click-tab-2) twice over, with new bids from 100 and a random
    number on every line, and random clicks (seeded: the same file every time)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests", "data", "transitions.jsonl")) as f:
        t = json.loads(f.readline())
    rng, lines = random.Random(0), t["obs"]["axtree"].split("\n")

    def page():
        out, bid = [], 100
        for line in lines * 2:
            body = line.lstrip()
            if body.startswith("["):
                out.append(" " * (len(line) - len(body)) + f"[{bid}] {body.split('] ', 1)[1]} {rng.randint(0, 999)}")
                bid += 1
            else:
                out.append(f"{line} {rng.randint(0, 999)}")
        return f"Goal: {t['goal']}\nURL: file:///m/miniwob/click-tab-2.html\n" + "\n".join(out)

    def turn():
        obs, action = page(), f"click('{100 + rng.randint(0, 30)}')"
        return {"observation": obs, "response": action, "action": action, "error": ""}

    with runlog.open_text(path, "w") as f:
        for d in range(n):
            f.write(json.dumps({"task": "click-tab-2", "seed": d, "source": "dream", "goal": t["goal"], "reward": 1.0,
                                "env_error": False, "iteration": 1, "group": 0, "turns": [turn() for _ in range(turns)],
                                "real_success": bool(d % 2)}) + "\n")


def bench_training(mode: str, data: str, judge_trajectories: str, steps: int, batch_size: int) -> list[dict]:
    """supervised training steps of --mode `mode` (wm or judge) for each TRAINING_CONFIGS entry, each
    in a fresh process (its own peak RSS): the base model, bf16 autocast where the CPU has it, AdamW."""
    rows = []
    for mb, gc in TRAINING_CONFIGS:
        r = subprocess.run([sys.executable, __file__, "--_train-step", f"{mode},{mb},{gc}", "--data", data,
                            "--judge-trajectories", judge_trajectories, "--train-steps", str(steps),
                            "--batch-size", str(batch_size)], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"training step {mode} micro-batch {mb} grad-ckpt {gc} failed:\n{r.stderr[-2000:]}")
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        log(f"training {mode}: {rows[-1]}")
    return rows


def train_step(spec: str, data: str, judge_trajectories: str, steps: int, batch_size: int):
    """In a fresh process: `steps` optimizer steps of train.py's supervised loop (supervised.
    accumulate_gradients, then AdamW) on the first batches of batch_size samples of `data`; prints
    {mode, micro_batch, grad_ckpt, samples, prompt_tokens (mean over the batches), step_s (the
    median step, seconds), peak_rss_mb}."""
    import torch

    import train

    mode, mb, gc = spec.split(",")
    bf16 = int(bool(policy.cpu_has_native_bf16()))  # bf16 autocast where the CPU has it, as the Makefile's BC_BF16
    args = train.parse_args(["--mode", mode, "--transitions", data, "--judge-trajectories", judge_trajectories,
                             "--micro-batch", mb, "--grad-ckpt", gc, "--bf16", str(bf16)])
    model, tok = policy.load_model(policy.DEFAULT_MODEL)
    if int(gc):
        policy.enable_grad_ckpt(model)
    model.train()
    samples = supervised.training_samples(args, tok)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    lens = [len(p) + len(t) for p, t in samples]
    times, prompt_tokens = [], []
    for step in range(steps):
        batch = [samples[i] for i in supervised.batch_indices(lens, step, batch_size, 0)]
        t0 = time.perf_counter()
        supervised.accumulate_gradients(model, tok, batch, sum(len(t) for _, t in batch), int(mb), "cpu", bool(bf16))
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        prompt_tokens += [len(p) for p, _ in batch]
    print(json.dumps({"mode": mode, "micro_batch": int(mb), "grad_ckpt": int(gc), "samples": len(samples),
                      "prompt_tokens": round(sum(prompt_tokens) / len(prompt_tokens)),
                      "step_s": round(sorted(times)[len(times) // 2], 2),
                      "peak_rss_mb": round(runlog.peak_rss_mb())}))


def bc_padding(demos: str, epochs: float = 2.0, batch_size: int = 32, micro_batch: int = 8, seed: int = 0) -> dict:
    """Token positions a BC run computes (prompt + reply, padded to each micro-batch's longest sample)
    against the real tokens, over train.py's batches (supervised.batch_indices) for `demos`, with the
    micro-batches cut from each batch in its random order and sorted by length (what train.py does).
    Returns {samples, real, random, sorted} in tokens."""
    import train

    args = train.parse_args(["--mode", "bc", "--demos", demos])
    lens = [len(p) + len(r) for p, r in supervised.bc_samples(demos, policy.load_tokenizer(), args)]
    out = {"samples": len(lens), "real": 0, "random": 0, "sorted": 0}
    for step in range(int(max(1, len(lens) // batch_size) * epochs)):
        batch = supervised.batch_indices(lens, step, batch_size, seed, by_length=False)
        out["real"] += sum(lens[i] for i in batch)
        for key, order in (("random", batch), ("sorted", supervised.batch_indices(lens, step, batch_size, seed))):
            for m in range(0, len(order), micro_batch):
                mb = order[m:m + micro_batch]
                out[key] += max(lens[i] for i in mb) * len(mb)
    return out


def first_turn_prompts(tok, demos: str, n: int, prompt: compress.PromptSettings) -> list[list[int]]:
    """The first-turn prompts of n demonstrations of different tasks (what a group's G members see)."""
    out, seen = [], set()
    for t in read_jsonl(demos):
        if t["task"] not in seen:
            seen.add(t["task"])
            out.append(prompt.build(tok, [], t["turns"][0]["observation"]))
    return out[:n]


def bench_generation(model, tok, prompts: list[list[int]], groups=(1, 4, 8), max_new_tokens: int = 32,
                     repeats: int = 2) -> list[dict]:
    """Seconds to sample G replies to one prompt (temperature 1), with the prompt prefilled once and
    its KV cache shared (policy.generate's default; also with the cache grown by torch.cat every token,
    as before policy._preallocate) or prefilled G times, and with Hugging Face's own generate for
    reference; the mean over `prompts` and `repeats`, and tokens sampled."""
    import torch

    rows = []
    for g in groups:
        for mode in ("shared", "shared-growing-cache", "separate", "hf-generate"):
            if g == 1 and mode == "separate":  # (the same thing)
                continue
            t_sum, toks, n = 0.0, 0, 0
            for _ in range(repeats):
                for p in prompts:
                    t0 = time.perf_counter()
                    if mode == "hf-generate":
                        ids = torch.tensor([p] * g)
                        with torch.no_grad():
                            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                                 temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
                                                 eos_token_id=policy.stop_ids(tok), pad_token_id=tok.pad_token_id)
                        toks += int((out[:, len(p):] != tok.pad_token_id).sum())
                    else:
                        samples = policy.generate(model, tok, [p] * g, max_new_tokens=max_new_tokens, temperature=1.0,
                                                  share_prefill=mode != "separate",
                                                  preallocate=mode != "shared-growing-cache")
                        toks += sum(len(s.ids) for s in samples)
                    t_sum += time.perf_counter() - t0
                    n += 1
            rows.append({"G": g, "mode": mode, "s_per_group": t_sum / n, "tokens_per_group": toks / n,
                         "prompt_tokens": sum(len(p) for p in prompts) / len(prompts)})
    one = next(r["s_per_group"] for r in rows if r["G"] == 1 and r["mode"] == "shared")
    for r in rows:
        r["vs_one_prompt"] = r["s_per_group"] / one
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", default=None, help="policy checkpoint (default runs/bc/final if present, else the base model; "
                   "dreams: `expert` for the scripted expert's replies, no policy model)")
    p.add_argument("--only", choices=["rollout", "compression", "chaos", "workers", "padding", "generation", "dreams", "training",
                                      "deltas"], default=None, help="run one part")
    p.add_argument("--wm", default=None, help="dreams: world-model checkpoint (default runs/wm/final if present, else the base model)")
    p.add_argument("--data", default=None, help="dreams, deltas: real transitions (default runs/transitions.jsonl if "
                   "present, else tests/data/transitions.jsonl)")
    p.add_argument("--dream-len", type=int, default=3, help="dreams: steps per episode, imagined or real")
    p.add_argument("--wm-max-new-tokens", type=int, default=256, help="dreams: the Δ length limit (dream mode's is 256)")
    p.add_argument("--tasks", default="click-button,click-link,enter-text,login-user", help="tasks of the rollout benchmarks")
    p.add_argument("--episodes-per-task", type=int, default=8, help="episodes per task and N")
    p.add_argument("--ns", default="1,2,4,8", help="numbers of concurrent browsers to compare")
    p.add_argument("--max-steps", type=int, default=6, help="episode length limit")
    p.add_argument("--out", default="runs/bench", help="where the JSON and markdown go")
    p.add_argument("--env-only", action="store_true", help="workers part: the environments alone, no rollouts with the policy")
    p.add_argument("--train-mode", choices=["judge", "wm"], default="judge", help="training: which model's steps")
    p.add_argument("--judge-trajectories", default="", help="training: trajectory files the judge learns from, as "
                   "train.py's flag (default: 8 synthetic six-turn dreams, write_long_dreams, and no transitions)")
    p.add_argument("--train-steps", type=int, default=3, help="training: optimizer steps per configuration")
    p.add_argument("--batch-size", type=int, default=8, help="training: samples per optimizer step")
    p.add_argument("--_train-step", dest="train_step", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_step-memory", dest="step_memory", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_turn", dest="turn", type=int, default=10, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.step_memory:
        return step_memory(a.step_memory, a.turn, a.ckpt)
    if a.train_step:
        return train_step(a.train_step, a.data, a.judge_trajectories, a.train_steps, a.batch_size)
    if a.only == "padding":
        r = bc_padding("runs/demos.jsonl")
        print(f"BC on runs/demos.jsonl ({r['samples']} samples, 2 epochs, batches of 32 in micro-batches of 8): "
              f"{r['real']} real tokens; computed with padding: random order {r['random']} ({r['random'] / r['real']:.2f}x), "
              f"sorted by length {r['sorted']} ({r['sorted'] / r['real']:.2f}x)")
        return
    if a.data is None:
        a.data = "runs/transitions.jsonl" if os.path.exists("runs/transitions.jsonl") else "tests/data/transitions.jsonl"
    if a.only == "deltas":
        rows = delta_lengths(policy.load_tokenizer(), a.data)
        by_task = {}
        for r in rows:
            by_task.setdefault(r["task"], []).append(r)
        print(f"Δ tokens on {a.data} ({len(rows)} transitions), line by line -> with `=` blocks:")
        for task, rs in [("all", rows)] + sorted(by_task.items()):
            lines, blocks = sum(r["lines"] for r in rs), sum(r["blocks"] for r in rs)
            print(f"  {task}: total {lines} -> {blocks} ({blocks / lines:.0%}), largest {max(r['lines'] for r in rs)} -> "
                  f"{max(r['blocks'] for r in rs)}, changed {sum(r['lines'] != r['blocks'] for r in rs)}")
        return
    if a.only == "training":
        os.makedirs(a.out, exist_ok=True)
        if a.train_mode == "judge" and not a.judge_trajectories:  # long prompts: what the judge's memory is about
            a.judge_trajectories, a.data = os.path.join(a.out, "long_dreams.jsonl"), ""
            write_long_dreams(a.judge_trajectories)
        md = [f"supervised training steps ({a.train_mode}), base model, batches of {a.batch_size}, median of "
              f"{a.train_steps} steps, {os.cpu_count()} CPU cores; transitions '{a.data}', trajectories "
              f"'{a.judge_trajectories}'", "",
              "| mode | samples | mean prompt tokens | micro-batch | grad-ckpt | s per step | peak RSS MB |",
              "|---|---|---|---|---|---|---|"]
        rows = bench_training(a.train_mode, a.data, a.judge_trajectories, a.train_steps, a.batch_size)
        md += [f"| {r['mode']} | {r['samples']} | {r['prompt_tokens']} | {r['micro_batch']} | {r['grad_ckpt']} | "
               f"{r['step_s']} | {r['peak_rss_mb']} |" for r in rows]
        with runlog.open_text(os.path.join(a.out, "training.json"), "w") as f:
            json.dump(rows, f, indent=1)
        with runlog.open_text(os.path.join(a.out, "training.md"), "w") as f:
            f.write("\n".join(md) + "\n")
        print("\n".join(md))
        return
    if a.ckpt is None:
        a.ckpt = "runs/bc/final" if os.path.isdir("runs/bc/final") else ""
    tasks = a.tasks.split(",")
    ns = [int(x) for x in a.ns.split(",")]
    if a.only == "dreams" and a.ckpt == "expert":
        model, tok = None, policy.load_tokenizer()
    else:
        model, tok = policy.load_model(a.ckpt or policy.DEFAULT_MODEL)
    trained = checkpoint.trained_settings(a.ckpt if a.ckpt != "expert" else None)
    think, bid_last = trained.get("think", False), trained.get("bid_last", False)
    prompt, budget = compress.PromptSettings(think=think, bid_last=bid_last), checkpoint.reply_budget(think)
    use_prompt(prompt, budget)  # every bench rollout prompts the policy as eval.py would
    os.makedirs(a.out, exist_ok=True)
    md, res = [f"policy: {a.ckpt or 'base model'}, tasks {a.tasks}, {os.cpu_count()} CPU cores", ""], {}
    if a.only in (None, "rollout"):
        rows, ceiling, gen = bench_rollout(model, tok, tasks, ns, a.episodes_per_task, a.max_steps)
        res["rollout"], res["ceiling"], res["generation"] = rows, ceiling, gen
        base = rows[0]["steps_per_s"]
        md += ["| browsers N | env steps/s | trajectories/min | speed-up vs N=1 | mean batch | success | env_error |",
               "|---|---|---|---|---|---|---|"]
        md += [f"| {r['N']} | {r['steps_per_s']:.2f} | {r['traj_per_min']:.1f} | {r['steps_per_s'] / base:.2f}x | "
               f"{r['mean_batch']:.1f} | {r['success']:.0%} | {r['env_error']} |" for r in rows]
        md += ["", f"generation alone (no browser), the same {ceiling['prompts']} prompts in batches of {max(ns)}: "
               f"{ceiling['steps_per_s']:.2f} actions/s, {ceiling['tokens_per_s']:.0f} tokens/s; rollout at N={max(ns)} reaches "
               f"{rows[-1]['steps_per_s'] / ceiling['steps_per_s']:.0%} of it.",
               f"generation tokens/s: one prompt at a time {gen['one_at_a_time_tok_s']:.1f}, batched 16 {gen['batched_16_tok_s']:.1f}", ""]
    if a.only in (None, "generation"):
        prompts = first_turn_prompts(tok, "runs/demos.jsonl", 6, prompt)
        rows = bench_generation(model, tok, prompts, max_new_tokens=budget)
        res["generation_groups"] = rows
        md += ["| G | prefill | s per group | vs one prompt | tokens sampled | prompt tokens |", "|---|---|---|---|---|---|"]
        md += [f"| {r['G']} | {r['mode']} | {r['s_per_group']:.3f} | {r['vs_one_prompt']:.2f}x | {r['tokens_per_group']:.1f} | "
               f"{r['prompt_tokens']:.0f} |" for r in rows]
        md += ["", "a group's first turn: G samples (temperature 1) of one first-turn prompt, 6 tasks' prompts x 2 repeats; "
               "shared = one prefill whose KV cache is copied to the G replies (policy.generate), shared-growing-cache = "
               "the same with the KV cache grown by torch.cat every token (preallocate=False), separate = G prefills, "
               "hf-generate = Hugging Face's generate on G copies", ""]
    if a.only in (None, "compression"):
        rows, mem = bench_compression(tok, a.ckpt)
        res["compression"], res["memory"] = rows, mem
        md += ["| turn | " + " | ".join(str(r["turn"]) for r in rows) + " |", "|---" * (len(rows) + 1) + "|",
               "| prompt tokens, compressed | " + " | ".join(str(r["compressed"]) for r in rows) + " |",
               "| prompt tokens, full | " + " | ".join(str(r["full"]) for r in rows) + " |", "",
               "| turn | mode | prompt tokens | step s | peak RSS MB | step's extra MB |", "|---|---|---|---|---|---|"]
        md += [f"| {m['turn']} | {m['mode']} | {m['prompt_tokens']} | {m['step_s']} | {m['peak_rss_mb']} | {m['step_extra_mb']} |" for m in mem]
        md += [""]
    if a.only in (None, "chaos"):
        c = bench_chaos(model, tok, tasks, max(2, a.episodes_per_task // 2) * 2, a.max_steps, max(ns))
        res["chaos"] = c
        md += ["| chaos: episodes | browsers killed | completed | env_error | lost | wall s |", "|---|---|---|---|---|---|",
               f"| {c['episodes']} | {c['browsers_killed']} | {c['completed']} | {c['env_error']} | {c['lost']} | {c['wall_s']} |", ""]
    if a.only == "dreams":  # (only on request: it loads a second model and generates Δs on the CPU)
        if a.wm is None:
            a.wm = "runs/wm/final" if os.path.isdir("runs/wm/final") else ""
        n = max(ns)
        rows = bench_dreams(model, tok, a.wm, a.data, n, a.episodes_per_task * 2, a.dream_len, a.wm_max_new_tokens)
        res["dreams"] = rows
        md += [f"replies: {a.ckpt or 'base model'}; world model: {a.wm or 'the base model (untrained)'}, Δ limit "
               f"{a.wm_max_new_tokens} tokens, start states {a.data}, N = {n}, episodes of at most {a.dream_len} steps", "",
               "| steps of | steps | wall s | steps/s | vs real | policy generate s | env s | mean Δ batch | env_error |",
               "|---|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['mode']} | {r['steps']} | {r['wall_s']:.1f} | {r['steps_per_s']:.2f} | "
               f"{r['steps_per_s'] / rows[0]['steps_per_s']:.2f}x | {r['policy_generate_s']:.1f} | {r['env_s']:.1f} | "
               f"{r.get('wm_mean_batch', 1.0):.1f} | {r['env_error']} |" for r in rows] + [""]
    if a.only == "workers":  # (not in the default run: it repeats the rollout part twice over)
        env_rows, rollout_rows = bench_workers(model, tok, tasks, ns, a.episodes_per_task, a.max_steps, a.env_only)
        res["workers_env"], res["workers_rollout"] = env_rows, rollout_rows
        full = {(r["N"], r["workers"]): r for r in rollout_rows}
        md += ["| N | workers | env-only steps/s | env-only episodes/min | rollout steps/s | rollout traj/min | env_error |",
               "|---|---|---|---|---|---|---|"]
        for r in env_rows:
            f = full.get((r["N"], r["workers"]))
            md.append(f"| {r['N']} | {r['workers']} | {r['steps_per_s']:.2f} | {r['episodes_per_min']:.1f} | "
                      + (f"{f['steps_per_s']:.2f} | {f['traj_per_min']:.1f} | {r['env_error']}+{f['env_error']} |"
                         if f else f"- | - | {r['env_error']} |"))
        md += ["", f"env only: the scripted expert's actions, {env_rows[0]['episodes']} episodes per row"
               f" (tasks {a.tasks}, max {a.max_steps} steps); rollout: the policy, sampled, as in the rollout part.", ""]
    with runlog.open_text(os.path.join(a.out, "bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    with runlog.open_text(os.path.join(a.out, "bench.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
