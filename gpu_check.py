"""The GPU check: the training code on CUDA in bf16, its speed, and whether padding changes log-probs.

    python gpu_check.py --model ~/.cache/webdream/SmolLM2-135M-Instruct --demos runs/demos.jsonl --out runs/gpu

What it runs, each part timed, everything in OUT/gpu_check.json and OUT/gpu_check.md:
1. BC: `train.py --mode bc --bf16 1` on the demonstrations, on the GPU (tokens/s, step time, memory);
2. generation, the rollout's half without browsers: generators.HFGenerator (bf16) on first-turn
   prompts of the demonstrations, groups of G copies, with the prefill shared and not (tokens/s);
3. the update, the RL step's other half: update.policy_update (M-GRPO, 2 epochs x 2 minibatches)
   on trajectories built from the demonstrations with rewards that vary in each group (tokens/s);
4. padding: a short prompt's reply log-probs alone and beside a long prompt that left-pads it,
   fp32 and bf16 (max |difference|).
Browsers are not needed (the GPU machine may have no Chromium): parts 2 and 3 are the two halves of
a real-mode iteration, measured apart. When --model holds a config and tokenizer but no weights, a
model of that architecture is built with random weights (the speed is the architecture's).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

import compress
import generators
import policy
import update
from runlog import open_text, read_jsonl

ROOT = os.path.dirname(os.path.abspath(__file__))


def model_folder(path: str, out: str) -> str:
    """`path` itself when it holds weights, else a copy with random weights of its config's architecture."""
    if any(f.endswith((".safetensors", ".bin")) for f in os.listdir(path)):
        return path
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dst = os.path.join(out, "random-init")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)).save_pretrained(dst)
    AutoTokenizer.from_pretrained(path).save_pretrained(dst)
    return dst


def bc(model_dir: str, demos: str, out: str, epochs: float) -> dict:
    """train.py --mode bc --bf16 1 in a subprocess; its logged throughput."""
    t0 = time.time()
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--mode", "bc", "--model", model_dir, "--demos", demos,
           "--out", os.path.join(out, "bc"), "--bf16", "1", "--epochs", str(epochs), "--micro-batch", "16",
           "--save-every", "1000"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        return {"error": r.stderr[-2000:]}
    m = read_jsonl(os.path.join(out, "bc", "metrics.jsonl"))
    return {"steps": len(m), "wall_s": time.time() - t0, "tokens_per_s": m[-1]["perf/tokens_per_s"],
            "step_s": sum(x["perf/step_s"] for x in m[1:]) / max(1, len(m) - 1), "loss_first": m[0]["loss/bc"],
            "loss_last": m[-1]["loss/bc"], "model": os.path.join(out, "bc", "final")}


def prompts_and_replies(tok, demos: str, n: int) -> list[tuple[list[int], list[int]]]:
    """(first-turn prompt ids, expert reply ids + end of turn) of n demonstrations, prompted as train.py's
    defaults prompt (a thought, the bids after the names: checkpoint.PROMPT_DEFAULTS)."""
    settings = compress.PromptSettings(think=True, bid_last=True)
    out = []
    for t in read_jsonl(demos)[:n]:
        turn = t["turns"][0]
        out.append((settings.build(tok, [], turn["observation"]),
                    compress.encode_reply(tok, turn["action"])))
    return out


def generation(model, tok, prompts: list[list[int]], groups=(1, 8, 32), max_new_tokens: int = 64,
               bf16: bool = True) -> list[dict]:
    """Tokens/s of G samples of each prompt, the prefill shared and not (best of three calls)."""
    gen = generators.HFGenerator(model, tok, bf16=bf16, batch_size=256)
    rows = []
    for g in groups:
        for share in (True, False):
            best = None
            for _ in range(3):  # the first call of a shape warms kernels up: the best of three is kept
                sync()
                t0 = time.perf_counter()
                samples = policy.generate(model, tok, [p for p in prompts for _ in range(g)], temperature=1.0,
                                          max_new_tokens=max_new_tokens, batch_size=256, bf16=bf16, share_prefill=share)
                sync()
                dt = time.perf_counter() - t0
                best = dt if best is None else min(best, dt)
            dt = best
            toks = sum(len(s.ids) for s in samples)
            rows.append({"G": g, "shared_prefill": share, "prompts": len(prompts), "replies": len(samples),
                         "s": dt, "tokens_per_s": toks / dt, "replies_per_s": len(samples) / dt})
    assert gen.generate(prompts[:1], max_new_tokens=4, temperature=0.0)  # the generator object works too
    return rows


def rl_update(model, tok, pairs: list[tuple[list[int], list[int]]], device, group_size: int = 8) -> dict:
    """One update.policy_update (M-GRPO, 2 epochs x 2 minibatches, bf16) on groups of G copies of each
    (prompt, reply) with rewards that alternate 1, 0 (every group has signal)."""
    trajs = []
    for k, (p, r) in enumerate(pairs):
        for j in range(group_size):
            trajs.append({"task": "t", "seed": k, "env_error": False, "reward": float(j % 2), "success": j % 2 == 1,
                          "turns": [{"prompt_ids": p, "response_ids": r, "response_logprobs": [0.0] * len(r)}]})
    cfg = update.UpdateConfig(ppo_epochs=2, minibatches=2, micro_batch=64, bf16=device.type == "cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    sync()
    t0 = time.perf_counter()
    stats = update.policy_update(model, opt, tok, trajs, cfg, device, 1, seed=0)
    sync()
    dt = time.perf_counter() - t0
    tokens = sum(len(p) + len(r) for p, r in pairs) * group_size
    return {"trajectories": len(trajs), "optimizer_steps": stats["loss/updates"], "s": dt,
            # each sample is scored once for pi_old and run forward+backward once per epoch
            "sample_tokens_per_s": tokens * (1 + cfg.ppo_epochs) / dt,
            "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else 0.0}


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def padding_check(model, tok, pairs, device) -> dict:
    """Max |log-prob difference| of a short prompt's reply scored alone vs beside a long prompt, fp32 and bf16."""
    short, long_ = min(pairs, key=lambda x: len(x[0])), max(pairs, key=lambda x: len(x[0]))
    long_prompt = long_[0] + long_[0][-200:]  # longer still: the short row is left-padded by hundreds
    out = {"short_prompt_tokens": len(short[0]), "long_prompt_tokens": len(long_prompt)}
    n = len(short[1])  # replies are right-aligned: the short reply is the last n positions of its row
    for name, bf16 in (("fp32", False), ("bf16", True)):
        with torch.no_grad():
            alone, _, _ = update.score(model, tok, [(0, short[0], short[1])], 1.0, bf16, device)
            both, _, _ = update.score(model, tok, [(0, short[0], short[1]), (1, long_prompt, long_[1])], 1.0, bf16, device)
        out[f"max_abs_diff_{name}"] = float((alone[0, -n:] - both[0, -n:]).abs().max())
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=policy.DEFAULT_MODEL, help="a model folder (weights optional, see above)")
    ap.add_argument("--demos", default="runs/demos.jsonl", help="expert demonstrations (experts.py)")
    ap.add_argument("--out", default="runs/gpu", help="output folder")
    ap.add_argument("--bc-epochs", type=float, default=1.0, help="BC passes over the demonstrations")
    ap.add_argument("--cpu", action="store_true", help="a dry run on the CPU (fp32; tiny sizes make sense here)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available() and not a.cpu:
        ap.error("gpu_check.py needs a CUDA GPU (--cpu: a dry run)")
    device = torch.device("cpu" if a.cpu else "cuda")
    os.makedirs(a.out, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu (dry run)", "torch": torch.__version__}
    import transformers

    res["transformers"] = transformers.__version__
    src = model_folder(policy.resolve_model(a.model), a.out)
    res["bc"] = bc(src, a.demos, a.out, a.bc_epochs)
    print(json.dumps(res, indent=1), flush=True)
    model, tok = policy.load_model(res["bc"].get("model", src), device=device)
    pairs = prompts_and_replies(tok, a.demos, 4 if a.cpu else 32)
    res["padding"] = padding_check(model, tok, pairs, device)
    res["generation"] = generation(model, tok, [p for p, _ in pairs[:16]], groups=(1, 4) if a.cpu else (1, 8, 32),
                                   max_new_tokens=8 if a.cpu else 64, bf16=not a.cpu)
    res["update"] = rl_update(model, tok, pairs, device, group_size=2 if a.cpu else 8)
    with open_text(os.path.join(a.out, "gpu_check.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = [f"GPU check on {res['gpu']} (torch {res['torch']}, transformers {res['transformers']})", "",
          f"BC (bf16): {res['bc'].get('steps')} steps, {res['bc'].get('tokens_per_s', 0):.0f} tokens/s, "
          f"{res['bc'].get('step_s', 0):.2f} s a step of 32 samples, loss {res['bc'].get('loss_first', 0):.3f} -> "
          f"{res['bc'].get('loss_last', 0):.3f}", "",
          "| G | shared prefill | replies | s | tokens/s | replies/s |", "|---|---|---|---|---|---|"]
    md += [f"| {r['G']} | {r['shared_prefill']} | {r['replies']} | {r['s']:.2f} | {r['tokens_per_s']:.0f} | "
           f"{r['replies_per_s']:.1f} |" for r in res["generation"]]
    u, p = res["update"], res["padding"]
    md += ["", f"update (M-GRPO, 2 epochs x 2 minibatches, bf16): {u['trajectories']} trajectories, {u['optimizer_steps']} "
           f"optimizer steps in {u['s']:.2f} s, {u['sample_tokens_per_s']:.0f} tokens/s, peak {u['peak_gb']:.1f} GB",
           f"padding: a {p['short_prompt_tokens']}-token prompt's reply log-probs alone vs left-padded beside a "
           f"{p['long_prompt_tokens']}-token prompt: max |diff| fp32 {p['max_abs_diff_fp32']:.2e}, bf16 {p['max_abs_diff_bf16']:.2e}"]
    with open_text(os.path.join(a.out, "gpu_check.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
