"""webdream training: behaviour cloning, then multi-turn RL on real web pages or in dreams.

    python train.py --mode bc --demos runs/demos.jsonl --out runs/bc           # BC warm-up
    python train.py --mode real --init runs/bc/final --out runs/real           # M-GRPO on real pages
    torchrun --nproc_per_node 2 train.py --mode real --init runs/bc/final      # same, 2 processes
    python train.py --mode real --out runs/real --resume                      # continue an interrupted run
    python train.py --mode wm --transitions runs/transitions.jsonl --out runs/wm   # the Δ world model
    python train.py --mode dream --init runs/bc/final --real-ratio 0.4           # GSPO in dreams (DynaWeb)

--mode bc:   supervised fine-tuning on expert trajectories, loss on action tokens only
             (WebAgent-R1's behaviour-cloning warm-up, Sec. 3.1).
--mode real: M-GRPO (mgrpo.py) on trajectories collected in real headless Chromium (rollout.py),
             every prompt built with dynamic context compression (compress.py).
--mode wm:    the world model (world_model.py): -log p(Δ | goal, page, action) on real transitions.
--mode dream: DynaWeb: GSPO (gspo.py) on imagined rollouts (world_model.DreamEnv, run by rollout.py
             unchanged), with a share --real-ratio of every batch made of real expert trajectories.

Under torchrun each rank collects its own groups on its own share of the tasks and gradients
are averaged across ranks (gloo on CPU, nccl on GPU). Checkpoints are Hugging Face folders
(safetensors) plus optimizer, step and RNG state, written atomically; --resume continues from
the newest. Metrics go to TensorBoard (out/tb) and out/metrics.jsonl.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

import compress
import env as webenv
import experts
import gspo
import mgrpo
import policy
from rollout import EnvWorkers, rollout


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("run")
    g.add_argument("--mode", choices=["bc", "wm", "real", "dream"], required=True,
                   help="bc: behaviour cloning; wm: train the Δ world model; real: RL on real pages; "
                        "dream: RL on the world model's imagined pages mixed with real expert trajectories")
    g.add_argument("--out", default=None, help="run folder (checkpoints, logs); default runs/<mode>")
    g.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    g.add_argument("--seed", type=int, default=0, help="random seed (each rank adds its rank)")
    g.add_argument("--save-every", type=int, default=5, help="checkpoint every N optimizer steps (bc) or iterations (real)")
    g.add_argument("--keep-ckpts", type=int, default=2, help="how many step checkpoints to keep")
    g.add_argument("--report-every", type=int, default=5,
                   help="real/dream: every N iterations (and at the end) write out/report/report.html with the "
                        "iteration's trajectories, screenshots (real pages), dream replays and curves (0: never)")
    g = p.add_argument_group("model")
    g.add_argument("--model", default=policy.DEFAULT_MODEL, help="default model, a local HF folder or a hub id")
    g.add_argument("--init", default=None, help="checkpoint folder to start from (e.g. runs/bc/final); overrides --model")
    g.add_argument("--tiny", action="store_true", help="a tiny random model with the model's tokenizer (tests, smoke runs)")
    g.add_argument("--lora-rank", type=int, default=0, help="train a LoRA adapter of this rank instead of all weights")
    g.add_argument("--bf16", type=int, default=0, help="bf16 autocast for training (1/0); generation uses it on GPU only (on CPU it is slower there)")
    g.add_argument("--grad-ckpt", type=int, default=0, help="gradient checkpointing (saves memory, costs ~30%% time)")

    def generator_kind(v):  # vLLM is the GPU generation backend: refuse it at once where there is no GPU
        if v == "vllm" and not torch.cuda.is_available():
            raise argparse.ArgumentTypeError("vllm needs a CUDA GPU (and `pip install vllm`); use --generator hf on CPU")
        return v
    g.add_argument("--generator", type=generator_kind, choices=["hf", "vllm"], default="hf",
                   help="how rollouts sample: hf (generate on the trained model itself) or vllm (an in-process vLLM "
                        "engine per rank; weights pushed after every update)")
    g.add_argument("--vllm-memory", type=float, default=0.3, help="--generator vllm: fraction of the GPU vLLM takes (weights + KV cache)")
    g.add_argument("--fsdp", action="store_true", help="shard weights, gradients and optimizer state over the torchrun "
                   "ranks (FSDP2), for models too big for DDP; needs torchrun with 2+ processes")
    g = p.add_argument_group("optimisation")
    g.add_argument("--lr", type=float, default=None, help="learning rate (default 1e-4 bc and wm, 1e-5 real; x10 with LoRA)")
    g.add_argument("--batch-size", type=int, default=32, help="bc: samples (turns) per optimizer step, all ranks")
    g.add_argument("--micro-batch", type=int, default=8, help="samples per forward pass (memory)")
    g.add_argument("--epochs", type=float, default=2.0, help="bc: passes over the demonstrations")
    g.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping")
    g.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    g = p.add_argument_group("data and environment")
    g.add_argument("--demos", default="runs/demos.jsonl", help="bc: expert trajectories (python experts.py)")
    g.add_argument("--transitions", default="runs/transitions.jsonl", help="wm: real transitions (python world_model.py --collect)")
    g.add_argument("--tasks", default=",".join(webenv.SUITE), help="comma-separated MiniWoB tasks")
    g.add_argument("--max-steps", type=int, default=6, help="turns per episode (test-time interaction budget)")
    g.add_argument("--keep-last", type=int, default=1, help="observations kept in full, the current one included")
    g.add_argument("--no-compress", action="store_true", help="ablation: keep every observation in full")
    g.add_argument("--max-prompt-tokens", type=int, default=1024, help="token budget of a prompt")
    g.add_argument("--think", action="store_true", help="ask for a <think> block before the action")
    g = p.add_argument_group("RL (real mode)")
    g.add_argument("--iterations", type=int, default=10, help="rollout + update iterations")
    g.add_argument("--groups-per-iter", type=int, default=8, help="groups (task, seed) per iteration, all ranks")
    g.add_argument("--group-size", type=int, default=4, help="G: trajectories per group")
    g.add_argument("--num-envs", type=int, default=16, help="browsers per rank, each stepping its own episode concurrently")
    g.add_argument("--env-workers", choices=["thread", "process"], default="thread",
                   help="real mode: each browser in a worker thread, or in a process of its own (bench.py --only workers); "
                        "dream mode always uses threads (the world model is shared in-process)")
    g.add_argument("--step-timeout", type=float, default=60.0, help="seconds before a hung page ends its episode as env_error")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of rollouts")
    g.add_argument("--max-new-tokens", type=int, default=None, help="reply length limit (default 32; 64 with --think)")
    g.add_argument("--loss", choices=["mgrpo", "gspo"], default=None,
                   help="token-level M-GRPO or sequence-level GSPO (default: mgrpo in real mode, gspo in dream mode)")
    g.add_argument("--clip-low", type=float, default=None, help="ratio clip below 1 (default 0.2 mgrpo, 3e-4 gspo)")
    g.add_argument("--clip-high", type=float, default=None, help="ratio clip above 1 (default 0.2 mgrpo, 4e-4 gspo)")
    g.add_argument("--kl-coef", type=float, default=0.0, help="KL penalty to the initial model (0: no reference model)")
    g.add_argument("--ppo-epochs", type=int, default=1, help="passes over each iteration's batch")
    g.add_argument("--minibatches", type=int, default=1, help="optimizer steps per pass")
    g = p.add_argument_group("dream mode (DynaWeb)")
    g.add_argument("--world-model", default="runs/wm/final", help="world-model checkpoint (train.py --mode wm)")
    g.add_argument("--real-ratio", type=float, default=0.4,
                   help="share of each batch's trajectories that are real expert trajectories (from --demos); "
                        "the rest are imagined groups (0.4: the paper's sweet spot)")
    g.add_argument("--dream-len", type=int, default=5, help="imagined steps per dream before it is cut")
    g.add_argument("--expert-loss", choices=["nll", "gspo"], default="nll",
                   help="how expert trajectories enter the loss: a likelihood term weighted by their share, "
                        "or GSPO samples with advantage 1 - (the dreams' mean reward)")
    g.add_argument("--replay-every", type=int, default=2,
                   help="every N iterations, replay a sample of dreams on real pages to check the dream reward (0: never)")
    g.add_argument("--replay-samples", type=int, default=4, help="dreams replayed per check and rank")
    args = p.parse_args(argv)
    # derived values and checks, right after parsing
    args.out = args.out or os.path.join("runs", args.mode)
    args.tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in args.tasks if t not in webenv.TASKS]
    if unknown:
        p.error(f"unknown task(s) {unknown}; known MiniWoB tasks include {webenv.SUITE}")
    rl = args.mode in ("real", "dream")
    if rl and args.group_size < 2:
        p.error("--group-size must be at least 2: a group of one has no advantage")
    if rl and args.temperature <= 0:
        p.error("--temperature must be > 0 in RL: it samples, and log-probs divide by it")
    if not 0.0 <= args.real_ratio <= 1.0:
        p.error(f"--real-ratio must be in [0, 1], got {args.real_ratio}")
    if args.dream_len < 1:
        p.error(f"--dream-len must be at least 1, got {args.dream_len}")
    if args.mode == "dream" and args.real_ratio < 1.0 and not os.path.isdir(args.world_model):
        p.error(f"--world-model {args.world_model}: no such checkpoint folder; train one with "
                "`python train.py --mode wm --transitions runs/transitions.jsonl --out runs/wm`")
    if args.loss is None:
        args.loss = "gspo" if args.mode == "dream" else "mgrpo"
    for name in ("ppo_epochs", "minibatches", "micro_batch", "keep_last", "batch_size", "max_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    world = int(os.environ.get("WORLD_SIZE", 1))
    if rl and args.groups_per_iter % world:
        p.error(f"--groups-per-iter {args.groups_per_iter} must divide evenly over {world} ranks")
    if args.tiny and args.init:
        p.error("--tiny builds a random model; it cannot start from --init")
    if args.kl_coef > 0 and args.loss == "gspo":
        p.error("--kl-coef applies to --loss mgrpo only (GSPO has no KL term)")
    if args.init and not os.path.isdir(args.init):
        p.error(f"--init {args.init}: no such checkpoint folder")
    if args.lr is None:
        args.lr = (1e-5 if rl else 1e-4) * (10 if args.lora_rank else 1)
    if args.clip_low is None:
        args.clip_low = 0.2 if args.loss == "mgrpo" else 3e-4
    if args.clip_high is None:
        args.clip_high = 0.2 if args.loss == "mgrpo" else 4e-4
    args.system = compress.THINK_SYSTEM_PROMPT if args.think else compress.SYSTEM_PROMPT
    if args.max_new_tokens is None:
        args.max_new_tokens = 64 if args.think else 32
    return args


# ----------------------------------------------------------------------------- distributed
def setup_distributed():
    """torchrun sets RANK/WORLD_SIZE; plain `python` runs as rank 0 of 1."""
    rank, world, local = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    if world > 1:
        # metrics are reduced as CPU tensors, so GPU runs need gloo beside nccl
        dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo")
    if device.type == "cpu":  # share the cores between the processes of this node
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    else:
        torch.cuda.set_device(device)
    return rank, world, device


def all_mean(values: dict, world: int) -> dict:
    """Average a dict of floats over ranks."""
    if world == 1 or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return {k: float(v) / world for k, v in zip(keys, t)}


def all_sum(x: float, world: int) -> float:
    if world == 1:
        return x
    t = torch.tensor([float(x)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t)


def average_gradients(model, world: int):
    """DDP's gradient all-reduce, spelled out: every rank ends with the mean gradient.

    Under --fsdp FSDP reduce-scatters the gradients itself (each backward, or once here inside
    policy.full_params); clip_grad_norm_ then takes the global norm of the sharded DTensor grads."""
    if policy.is_sharded(model):
        policy.reduce_sharded_grads(model)
        return
    if world == 1:
        return
    for p in model.parameters():
        if p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
            p.grad /= world


# ----------------------------------------------------------------------------- logging
class Logger:
    """`log(metrics, step)`: TensorBoard + JSONL on rank 0, a no-op elsewhere."""

    def __init__(self, out: str, enabled: bool):
        self.enabled = enabled
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(os.path.join(out, "tb"))
            self.jsonl = open(os.path.join(out, "metrics.jsonl"), "a")

    def log(self, metrics: dict, step: int):
        if not self.enabled:
            return
        for k, v in metrics.items():
            self.tb.add_scalar(k, v, step)
        self.jsonl.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
        self.jsonl.flush()
        self.tb.flush()

    def truncate(self, step: int):
        """On resume: forget the lines logged after the checkpoint we restart from (they are redone)."""
        if not self.enabled:
            return
        path = self.jsonl.name
        self.jsonl.close()
        with open(path) as f:
            keep = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
        with open(path, "w") as f:
            f.writelines(keep)
        self.jsonl = open(path, "a")

    def close(self):
        if self.enabled:
            self.tb.close()
            self.jsonl.close()


# ----------------------------------------------------------------------------- checkpoints
def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def save_checkpoint(out: str, name: str, model, tokenizer, optimizer, step: int, extra: dict, keep: int,
                    rank: int = 0, world: int = 1, settings: dict | None = None):
    """Write out/name atomically (a temp folder, then rename) and point out/latest at it.

    Collective: every rank calls it (each rank's RNG state is gathered so that a resumed run
    draws what an uninterrupted one would); rank 0 writes. `settings` (the prompt format the
    model was trained with) goes to webdream.json, which eval.py reads.
    """
    rngs = [None] * world
    if world > 1:
        dist.all_gather_object(rngs, rng_state())
    else:
        rngs = [rng_state()]
    weights = None  # None: save_pretrained takes the model's own state dict
    if policy.is_sharded(model):  # --fsdp: gather full weights and optimizer state on rank 0 (collective)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        weights = policy.full_state_dict(model)
        opt_state = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        final = os.path.join(out, name)
        tmp, old = final + ".tmp", final + ".old"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, state_dict=weights)
        tokenizer.save_pretrained(tmp)
        # under --fsdp the optimizer state is keyed by parameter name (torch.distributed.checkpoint's full form)
        torch.save({"optimizer": optimizer.state_dict() if weights is None else opt_state, "step": step,
                    "extra": extra, "rng": rngs}, os.path.join(tmp, "trainer_state.pt"))
        with open(os.path.join(tmp, "webdream.json"), "w") as f:
            json.dump({"step": step, **(settings or {})}, f, indent=1)
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(final):
            os.replace(final, old)  # never a moment with neither the old nor the new folder
        os.replace(tmp, final)
        with open(os.path.join(out, "latest.tmp"), "w") as f:
            f.write(name)
        os.replace(os.path.join(out, "latest.tmp"), os.path.join(out, "latest"))
        shutil.rmtree(old, ignore_errors=True)
        steps = sorted(d for d in os.listdir(out) if d.startswith("step-") and d[5:].isdigit())
        for d in steps[:-keep] if keep > 0 else []:
            shutil.rmtree(os.path.join(out, d), ignore_errors=True)
    barrier(world)


def prompt_settings(args) -> dict:
    """What eval.py needs to prompt a checkpoint the way it was trained."""
    return {"keep_last": args.keep_last, "no_compress": args.no_compress, "think": args.think,
            "max_prompt_tokens": args.max_prompt_tokens, "max_steps": args.max_steps,
            "max_new_tokens": args.max_new_tokens}


def latest_checkpoint(out: str) -> str | None:
    try:
        with open(os.path.join(out, "latest")) as f:
            path = os.path.join(out, f.read().strip())
        return path if os.path.isdir(path) else None
    except FileNotFoundError:
        return None


def build_model(args, device, path=None, fsdp=None):
    """(model, tokenizer); with --fsdp (or fsdp=True) the model is sharded over the ranks (policy.shard)."""
    fsdp = args.fsdp if fsdp is None else fsdp
    if fsdp and not (dist.is_initialized() and dist.get_world_size() > 1):
        raise RuntimeError("--fsdp shards the model over torchrun's processes: run "
                           "`torchrun --nproc_per_node N train.py ... --fsdp` with N >= 2 (one process trains plainly without it)")
    if path is not None:
        model, tok = policy.load_model(path, device=device)
    elif args.tiny:
        tok = policy.load_tokenizer(args.model)
        model = policy.tiny_model(tok)
    else:
        model, tok = policy.load_model(args.init or args.model, lora_rank=args.lora_rank, device=device)
    model.to(device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        # Every rank starts from rank 0's weights: a fresh LoRA adapter (or a --tiny model) is
        # drawn from each rank's own RNG, and nothing else would keep the replicas identical.
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, 0)
    if args.grad_ckpt:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if fsdp:
        policy.shard(model)  # after the broadcast: every rank shards the same weights
    return model, tok


# ----------------------------------------------------------------------------- behaviour cloning
def bc_samples(path: str, tokenizer, args) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, action ids + end-of-turn) for every turn of every expert trajectory, with the
    prompt built exactly as at rollout time (compression, budget, system prompt)."""
    samples = [s for traj in expert_trajectories(path, args) for s in expert_turns(traj, tokenizer, args)]
    if not samples:
        raise ValueError(f"{path} holds no successful expert trajectory for tasks {args.tasks}")
    return samples


def expert_trajectories(path: str, args) -> list[dict]:
    """The successful expert trajectories of args.tasks in a demos file (experts.py)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"--demos {path} not found: write it with `python experts.py --out {path}`")
    with open(path) as f:
        trajs = [json.loads(line) for line in f if line.strip()]
    return [t for t in trajs if t.get("success") and t["task"] in args.tasks]


def expert_turns(traj: dict, tokenizer, args) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reply ids + end-of-turn) for each turn of one expert trajectory."""
    eos = tokenizer.eos_token_id
    history, out = [], []
    for turn in traj["turns"]:
        prompt = compress.build_prompt(tokenizer, history, turn["observation"], keep_last=args.keep_last,
                                       compress=not args.no_compress, max_tokens=args.max_prompt_tokens,
                                       system=args.system)
        response = turn.get("response") or turn["action"]
        if args.think and not turn.get("response"):  # the thinking format: a short grounded thought first
            response = f"<think>{experts.thought(turn['observation'], turn['action'])}</think>{response}"
        out.append((prompt, tokenizer.encode(response, add_special_tokens=False) + [eos]))
        history.append({"observation": turn["observation"], "response": response})
    return out


def batch_indices(lengths: list[int], step: int, batch_size: int, seed: int, rank: int = 0, world: int = 1,
                  by_length: bool = True) -> list[int]:
    """This rank's samples for optimizer step `step` (0-based) of --mode bc/wm: each epoch a
    permutation seeded with seed + epoch (the same on every rank), cut into consecutive batches of
    batch_size (the remainder is left out); rank takes [rank::world] of its batch, sorted by
    length, longest first. Sorting changes no gradient (the same sum over the same samples) but
    makes micro-batches of similar lengths, which pad less (the default BC run: 1.18x the real
    tokens instead of 1.51x; bench.py --only padding, which passes by_length=False)."""
    per_epoch = max(1, len(lengths) // batch_size)
    epoch, offset = divmod(step, per_epoch)
    order = np.random.default_rng(seed + epoch).permutation(len(lengths))
    batch = order[offset * batch_size:(offset + 1) * batch_size][rank::world].tolist()
    return sorted(batch, key=lambda i: -lengths[i]) if by_length else batch


def train_supervised(args, rank, world, device, logger):
    """--mode bc (policy on expert actions) and --mode wm (world model on Δ): the same loop,
    -log p(target | prompt) averaged over target tokens, on different samples."""
    resume = latest_checkpoint(args.out) if args.resume else None
    model, tok = build_model(args, device, path=resume)
    if args.mode == "bc":
        samples = bc_samples(args.demos, tok, args)
    else:
        samples = wm_samples(args.transitions, tok, args)
    tag = args.mode
    per_rank = args.batch_size // world
    assert per_rank >= 1 and args.batch_size % world == 0, "--batch-size must divide evenly across ranks"
    steps_per_epoch = max(1, len(samples) // args.batch_size)
    total_steps = max(1, int(steps_per_epoch * args.epochs))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10) * max(0.1, 1 - s / total_steps))
    step = 0
    if resume:
        step = restore_state(resume, opt, rank=rank, model=model)
        logger.truncate(step)
        sched.last_epoch = step
    print0(rank, f"{tag}: {len(samples)} samples, {total_steps} steps of {args.batch_size}, lr {args.lr}, world {world}")
    bar = tqdm(total=total_steps, initial=step, desc=tag, disable=rank != 0)
    t_start, tokens = time.time(), 0
    lengths = [len(prompt) + len(target) for prompt, target in samples]
    while step < total_steps:
        batch = batch_indices(lengths, step, args.batch_size, args.seed, rank, world)
        model.train()
        n_tok = sum(len(samples[i][1]) for i in batch)
        loss_sum = 0.0
        t0 = time.time()
        for mb in range(0, len(batch), args.micro_batch):
            idx = batch[mb:mb + args.micro_batch]
            ids, mask, resp_mask, L = policy.response_batch([samples[i][0] for i in idx], [samples[i][1] for i in idx], tok.pad_token_id)
            with policy.autocast(device, bool(args.bf16)):
                logp = policy.token_logprobs(model, ids.to(device), mask.to(device), L)  # (B, L)
            loss = -(logp * resp_mask.to(device)).sum() / n_tok  # token mean over the rank's batch
            loss.backward()
            loss_sum += loss.item()
            tokens += int(mask.sum())
        average_gradients(model, world)
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        m = all_mean({f"loss/{tag}": loss_sum, "loss/grad_norm": float(gnorm)}, world)
        m.update({"perf/step_s": time.time() - t0, "perf/tokens_per_s": all_sum(tokens, world) / (time.time() - t_start),
                  "charts/lr": sched.get_last_lr()[0], "charts/epoch": step / steps_per_epoch})
        logger.log(m, step)
        bar.update(1)
        bar.set_postfix(loss=f"{m[f'loss/{tag}']:.3f}")
        if step % args.save_every == 0 or step == total_steps:
            save_checkpoint(args.out, f"step-{step:06d}", model, tok, opt, step, {}, args.keep_ckpts, rank, world,
                            prompt_settings(args))
    bar.close()
    save_checkpoint(args.out, "final", model, tok, opt, step, {}, args.keep_ckpts, rank, world, prompt_settings(args))
    return model


def wm_samples(path: str, tokenizer, args) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, Δ ids + end-of-turn) for every recorded real transition (world_model.py)."""
    import world_model

    if not os.path.exists(path):
        raise FileNotFoundError(f"--transitions {path} not found: write it with `python world_model.py --collect`")
    trs = [t for t in world_model.load_transitions(path) if t["task"] in args.tasks]
    samples = world_model.wm_samples(trs, tokenizer, max_tokens=args.max_prompt_tokens)
    if not samples:
        raise ValueError(f"{path} holds no usable transition for tasks {args.tasks}")
    return samples


# ----------------------------------------------------------------------------- M-GRPO on real pages
def reporting(args, it: int) -> bool:
    """Whether iteration `it` (1-based) writes a report: every --report-every, and the last."""
    return bool(args.report_every) and (it % args.report_every == 0 or it == args.iterations)


def maybe_report(args, rank: int, it: int, trajs: list[dict]) -> None:
    """Every --report-every iterations and at the last, rank 0 writes out/report/report.html
    (report.py): this iteration's trajectories (rank 0's share) and the run's curves so far."""
    if rank != 0 or not reporting(args, it):
        return
    import report

    try:
        report.write_report(os.path.join(args.out, "report"), trajs, metrics_path=os.path.join(args.out, "metrics.jsonl"),
                            title=f"{args.out}: iteration {it} ({args.mode} mode)")
    except Exception as e:  # a report is for people: it must never end a training run
        print(f"warning: report at iteration {it} failed: {type(e).__name__}: {e}", file=sys.stderr)


def rollout_metrics(trajs: list[dict], rstats: dict, t_roll: float) -> dict:
    """One rank's rollout figures for the log: success, turns and parse errors over the episodes that
    did not end in env_error, the env_error share, and the rollout's timings (seconds)."""
    ok = [t for t in trajs if not t["env_error"]]
    return {"rollout/success": np.mean([t["success"] for t in ok]) if ok else 0.0,
            "rollout/turns": np.mean([t["steps"] for t in ok]) if ok else 0.0,
            "rollout/parse_error": np.mean([bool(u["error"]) and u["action"] is None for t in ok for u in t["turns"]] or [0]),
            "env/env_error": np.mean([t["env_error"] for t in trajs]) if trajs else 0.0,
            "perf/rollout_s": t_roll, "perf/generate_s": rstats.get("generate_s", 0.0),
            "perf/env_s": rstats.get("env_s", 0.0)}


def iteration_jobs(args, it: int, rank: int, world: int) -> list[tuple[str, int]]:
    """This rank's (task, seed) groups for iteration `it`, each repeated G times. Groups never
    straddle ranks: rank r takes groups r, r+world, ... of the iteration's list."""
    rng = random.Random(args.seed * 1_000_003 + it)  # the same list on every rank
    groups = []
    for g in range(args.groups_per_iter):
        task = args.tasks[(it * args.groups_per_iter + g) % len(args.tasks)]  # cycle through the suite
        groups.append((task, rng.choice(webenv.TRAIN_SEEDS)))
    return [job for job in groups[rank::world] for _ in range(args.group_size)]


def train_real(args, rank, world, device, logger):
    resume = latest_checkpoint(args.out) if args.resume else None
    model, tok = build_model(args, device, path=resume)
    ref = None
    if args.kl_coef > 0:
        ref, _ = build_model(args, device, fsdp=False)  # never sharded: ranks run different numbers of forward passes
        ref.eval().requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=args.weight_decay)
    # rollouts sample with HF generate on `model` itself or with a vLLM engine (weights pushed after each update)
    gen = policy.make_generator(args.generator, model, tok, bf16=bool(args.bf16) and device.type == "cuda",
                                gpu_memory_utilization=args.vllm_memory, seed=args.seed + rank,
                                max_model_len=args.max_prompt_tokens + args.max_new_tokens)
    it, env_steps = 0, 0
    if resume:
        state = torch.load(os.path.join(resume, "trainer_state.pt"), weights_only=False)
        it, env_steps = restore_state(resume, opt, state, rank, model), state["extra"].get("env_steps", 0)
        logger.truncate(it)
    # one long-lived browser per worker thread (or its child process), any task on each (rollout.py)
    pool = EnvWorkers(functools.partial(webenv.WebEnv, max_steps=args.max_steps), tok, num_envs=args.num_envs,
                      step_timeout=args.step_timeout, processes=args.env_workers == "process")
    print0(rank, f"real: {args.iterations} iterations x {args.groups_per_iter} groups x G={args.group_size}, world {world}")
    try:
        bar = tqdm(total=args.iterations, initial=it, desc="m-grpo", disable=rank != 0)
        while it < args.iterations:
            t0 = time.time()
            jobs = iteration_jobs(args, it, rank, world)
            # screenshots (about 40 ms a step) only in iterations that write a report, which only rank 0 does
            pool.set_env_attr("screenshots", rank == 0 and reporting(args, it + 1))
            # --fsdp: every rank holds the full weights through rollout and update (policy.full_params)
            with policy.full_params(model, opt):
                trajs, rstats = rollout(gen, tok, pool, jobs, temperature=args.temperature,
                                        max_new_tokens=args.max_new_tokens, keep_last=args.keep_last,
                                        compress_context=not args.no_compress, max_prompt_tokens=args.max_prompt_tokens,
                                        system=args.system, progress=rank == 0, desc=f"rollout {it}")
                t_roll = time.time() - t0
                lstats = policy_update(model, ref, opt, tok, trajs, args, device, world)
            gen.push_weights(model)  # the next rollout samples from the updated policy
            it += 1
            env_steps += int(all_sum(rstats.get("env_steps", 0), world))
            m = all_mean({**rollout_metrics(trajs, rstats, t_roll), **lstats}, world)
            m.update({"env/real_steps": env_steps, "perf/iter_s": time.time() - t0})
            logger.log(m, it)
            bar.update(1)
            bar.set_postfix(success=f"{m['rollout/success']:.2f}", clip=f"{m.get('loss/clip_frac', 0):.3f}")
            maybe_report(args, rank, it, trajs)
            if it % args.save_every == 0 or it == args.iterations:
                save_checkpoint(args.out, f"step-{it:06d}", model, tok, opt, it, {"env_steps": env_steps},
                                args.keep_ckpts, rank, world, prompt_settings(args))
        bar.close()
        save_checkpoint(args.out, "final", model, tok, opt, it, {"env_steps": env_steps}, args.keep_ckpts, rank, world,
                        prompt_settings(args))
    finally:
        pool.close()
    return model


# ----------------------------------------------------------------------------- GSPO in dreams (DynaWeb)
def dream_batch(args, it: int, rank: int, world: int, experts: list[dict]) -> tuple[list[tuple[str, int]], list[dict]]:
    """This rank's share of iteration `it`'s batch: (dream jobs, real expert trajectories).

    The batch holds about groups_per_iter * group_size trajectories: round(real_ratio * that) real
    expert trajectories drawn at random from the demos, and the rest as imagined groups of G
    dreams each, (task, seed) cycling through the suite; the seed picks a real start state.
    Expert trajectories and groups are dealt round-robin over ranks (groups never straddle ranks).
    """
    total = args.groups_per_iter * args.group_size
    n_real = round(args.real_ratio * total)
    n_groups = round((total - n_real) / args.group_size)
    rng = random.Random(args.seed * 1_000_003 + it)  # the same draw on every rank
    groups = [(args.tasks[(it * n_groups + g) % len(args.tasks)], rng.choice(webenv.TRAIN_SEEDS))
              for g in range(n_groups)]  # cycle through the suite: every task gets its turn
    real = [experts[rng.randrange(len(experts))] for _ in range(n_real)] if experts else []
    jobs = [job for job in groups[rank::world] for _ in range(args.group_size)]
    return jobs, real[rank::world]


def replay_dreams(trajs: list[dict], states: list[dict], renv_holder: list, args, it: int) -> tuple[dict, int, list[dict]]:
    """Replay a sample of dreams' actions on real pages (world_model.replay) and compare the world
    model's completion judgement (the dream reward) with the real reward.

    Returns (counts, real browser steps taken, records). counts: replayed (dreams replayed without
    an env_error), matched (whose start page was reproduced exactly on real pages), and, among the
    matched only, contradiction (predicted success differs from the real one) and false_success
    (predicted success that did not happen); train_dream sums them over ranks into rates.
    Records (for the HTML report): the dream with each turn's `real_observation` and
    `predicted_success` / `real_success`.
    """
    import world_model

    rng = random.Random(args.seed * 7919 + it)
    pool = [t for t in trajs if not t["env_error"] and t["turns"]]
    sample = rng.sample(pool, min(args.replay_samples, len(pool)))
    stats = {"contradiction": 0, "false_success": 0, "matched": 0, "replayed": 0}
    steps = 0
    records = []
    for t in sample:
        start = world_model.pick_start_state(states, t["seed"], t["task"])
        if start.get("seed") is None:
            continue
        if not renv_holder:
            renv_holder.append(webenv.WebEnv(t["task"], max_steps=max(30, len(start["prefix"]) + args.dream_len + 1)))
        r = world_model.replay(start, [u["response"] for u in t["turns"]], env=renv_holder[0])
        steps += r["steps"]
        if r["env_error"]:
            continue
        stats["replayed"] += 1
        if r["start_match"]:  # otherwise the real outcome says nothing about the world model
            stats["matched"] += 1
            stats["contradiction"] += int(r["success"] != t["success"])
            stats["false_success"] += int(t["success"] and not r["success"])
        turns = [{k: v for k, v in u.items() if k not in ("prompt_ids", "response_ids", "response_logprobs")}
                 for u in t["turns"]]
        obs_after = r["observations"] + [None] * (len(turns) - len(r["observations"]))
        # turn k shows the page the agent acted on; the real page after step k-1 is its counterpart
        for k, u in enumerate(turns):
            u["real_observation"] = u["observation"] if k == 0 else obs_after[k - 1]
        t["replayed"] = True  # the report shows the record (with the real pages) instead
        records.append({**{k: v for k, v in t.items() if k != "turns"}, "turns": turns, "iteration": it,
                        "predicted_success": t["success"], "real_success": r["success"],
                        "start_match": r["start_match"], "start": {k: start[k] for k in ("task", "seed", "prefix")}})
    return stats, steps, records


def dream_update(model, opt, tok, trajs: list[dict], real: list[dict], args, device, world) -> dict:
    """One policy update on this rank's imagined trajectories plus its real expert trajectories.

    How real expert trajectories enter the loss. Default (--expert-loss nll): a likelihood term
    weighted by their share of the batch, loss = (1 - share) * L_gspo + share * L_nll. An expert
    trajectory has no group of its own: every one succeeds, so a group-normalised advantage would
    be zero and it would teach nothing; the likelihood term keeps the policy on real pages'
    behaviour whatever the world model gets wrong, which is what the real data is there for.
    --expert-loss gspo instead makes them GSPO samples with advantage 1 - (mean dream reward):
    off-policy, clipped by the sequence ratio like every other sample.
    """
    ok = [t for t in trajs if not t["env_error"]]
    n_dream, n_real = all_sum(len(ok), world), all_sum(len(real), world)
    share = n_real / max(1.0, n_real + n_dream)
    nll, expert_trajs = [], []
    if args.expert_loss == "nll":
        nll = [s for t in real for s in expert_turns(t, tok, args)]
    else:
        base = all_sum(sum(t["reward"] for t in ok), world) / n_dream if n_dream else 0.0
        for k, t in enumerate(real):
            turns = [{"prompt_ids": p, "response_ids": r} for p, r in expert_turns(t, tok, args)]
            expert_trajs.append({"task": t["task"], "seed": f"expert-{k}", "turns": turns,
                                 "reward": 1.0, "success": True, "env_error": False, "advantage": 1.0 - base})
    stats = policy_update(model, None, opt, tok, trajs + expert_trajs, args, device, world, nll=nll,
                          nll_coef=share if args.expert_loss == "nll" else 0.0,
                          rl_scale=1.0 - share if args.expert_loss == "nll" else 1.0)
    stats.update({"dream/trajectories": n_dream, "dream/real_trajectories": n_real, "dream/real_share": share})
    return stats


def train_dream(args, rank, world, device, logger):
    """--mode dream: DynaWeb's loop. Each iteration: imagined groups from DreamEnv (rollout.py,
    the same asynchronous collector as real mode), plus real expert trajectories at --real-ratio,
    then one policy update (GSPO by default). Real browser steps (the replay checks) are counted
    apart from imagined ones."""
    import world_model

    resume = latest_checkpoint(args.out) if args.resume else None
    model, tok = build_model(args, device, path=resume)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=args.weight_decay)
    gen = policy.make_generator(args.generator, model, tok, bf16=bool(args.bf16) and device.type == "cuda",
                                gpu_memory_utilization=args.vllm_memory, seed=args.seed + rank,
                                max_model_len=args.max_prompt_tokens + args.max_new_tokens)
    it, real_steps, dream_steps = 0, 0, 0
    if resume:
        state = torch.load(os.path.join(resume, "trainer_state.pt"), weights_only=False)
        it = restore_state(resume, opt, state, rank, model)
        real_steps, dream_steps = state["extra"].get("env_steps", 0), state["extra"].get("dream_steps", 0)
        logger.truncate(it)
    experts = expert_trajectories(args.demos, args) if args.real_ratio > 0 else []
    if args.real_ratio > 0 and not experts:
        raise ValueError(f"{args.demos} holds no successful expert trajectory for tasks {args.tasks}")
    pool, states = None, []
    if args.real_ratio < 1:
        if not os.path.exists(args.transitions):
            raise FileNotFoundError(f"--transitions {args.transitions} not found (dream start states): write it with "
                                    "`python world_model.py --collect runs/transitions.jsonl`")
        states = [s for s in world_model.start_states(world_model.load_transitions(args.transitions))
                  if s["task"] in args.tasks]
        missing = sorted(set(args.tasks) - {s["task"] for s in states})
        if missing:
            raise ValueError(f"{args.transitions} has no start state of task(s) {missing}")
        wm, wm_tok = policy.load_model(args.world_model, device=device)
        wm.eval().requires_grad_(False)
        # A dream step waits for the world model's lock behind up to num_envs - 1 others (DreamEnv),
        # so its time limit scales with them; a dream has no page that can hang.
        pool = EnvWorkers(lambda task: world_model.DreamEnv(wm, wm_tok, states, args.dream_len,
                                                            bf16=bool(args.bf16) and device.type == "cuda"),
                          tok, num_envs=args.num_envs, step_timeout=args.step_timeout * args.num_envs)
    print0(rank, f"dream: {args.iterations} iterations, real ratio {args.real_ratio}, dream length {args.dream_len}, "
                 f"loss {args.loss}, expert loss {args.expert_loss}, world {world}")
    renv: list = []  # one real browser for the replay checks, opened on first use
    replays_path = os.path.join(args.out, "dream_replays.jsonl")
    if resume and rank == 0 and os.path.exists(replays_path):  # like metrics.jsonl: drop what is redone
        with open(replays_path) as f:
            kept = [line for line in f if line.strip() and json.loads(line).get("iteration", 0) <= it]
        with open(replays_path, "w") as f:
            f.writelines(kept)
    try:
        bar = tqdm(total=args.iterations, initial=it, desc="dream", disable=rank != 0)
        while it < args.iterations:
            t0 = time.time()
            jobs, real = dream_batch(args, it, rank, world, experts)
            trajs, rstats = [], {}
            with policy.full_params(model, opt):  # --fsdp: full weights on every rank through rollout and update
                if jobs:
                    trajs, rstats = rollout(gen, tok, pool, jobs, temperature=args.temperature,
                                            max_new_tokens=args.max_new_tokens, keep_last=args.keep_last,
                                            compress_context=not args.no_compress,
                                            max_prompt_tokens=args.max_prompt_tokens, system=args.system,
                                            source="dream", progress=rank == 0, desc=f"dream {it}")
                t_roll = time.time() - t0
                lstats = dream_update(model, opt, tok, trajs, real, args, device, world)
            gen.push_weights(model)  # the next rollout samples from the updated policy
            ok = [t for t in trajs if not t["env_error"]]
            replay_c, steps_now, records = {}, 0, []
            if args.replay_every and (it + 1) % args.replay_every == 0 and args.real_ratio < 1:  # on every rank together
                replay_c, steps_now, records = replay_dreams(ok, states, renv, args, it + 1)
            it += 1
            real_steps += int(all_sum(steps_now, world))
            dream_steps += int(all_sum(rstats.get("env_steps", 0), world))
            m = all_mean({**rollout_metrics(trajs, rstats, t_roll), **lstats}, world)
            if replay_c:  # every rank replays at the same iterations, so these collectives match
                c = {k: all_sum(v, world) for k, v in sorted(replay_c.items())}
                m.update({"dream/replayed": c["replayed"], "dream/replay_start_match": c["matched"] / max(1, c["replayed"]),
                          "dream/replay_contradiction": c["contradiction"] / max(1, c["matched"]),
                          "dream/replay_false_success": c["false_success"] / max(1, c["matched"])})
            m.update({"env/real_steps": real_steps, "dream/steps": dream_steps, "perf/iter_s": time.time() - t0})
            logger.log(m, it)
            if rank == 0 and records:
                with open(replays_path, "a") as f:
                    for r in records:
                        f.write(json.dumps(r) + "\n")
            bar.update(1)
            bar.set_postfix(success=f"{m['rollout/success']:.2f}", clip=f"{m.get('loss/clip_frac', 0):.4f}")
            maybe_report(args, rank, it, records + [t for t in trajs if not t.get("replayed")])
            extra = {"env_steps": real_steps, "dream_steps": dream_steps}
            if it % args.save_every == 0 or it == args.iterations:
                save_checkpoint(args.out, f"step-{it:06d}", model, tok, opt, it, extra, args.keep_ckpts, rank, world,
                                prompt_settings(args))
        bar.close()
        save_checkpoint(args.out, "final", model, tok, opt, it, {"env_steps": real_steps, "dream_steps": dream_steps},
                        args.keep_ckpts, rank, world, prompt_settings(args))
    finally:
        if pool is not None:
            pool.close()
        for e in renv:
            e.close()
    return model


def policy_update(model, ref, opt, tok, trajs, args, device, world, *, nll=None, nll_coef: float = 0.0,
                  rl_scale: float = 1.0) -> dict:
    """One policy update on this rank's trajectories with --loss mgrpo or gspo.

    Each turn is a sample (its prompt ids + its reply ids, exactly as generated). Micro-batches
    are built from whole trajectories, which GSPO's sequence ratio needs and M-GRPO does not mind.
    Advantages are group-normalised over (task, seed); a trajectory with an "advantage" key keeps
    that value instead (dream mode's expert trajectories under --expert-loss gspo).

    Dream mode adds `nll`, (prompt ids, reply ids) samples of real expert turns, whose token-mean
    negative log-likelihood enters each optimizer step with weight `nll_coef`, while the RL loss is
    scaled by `rl_scale`: loss = rl_scale * L_rl + nll_coef * L_nll.
    """
    nll = nll or []
    trajs = [t for t in trajs if not t["env_error"] and any(u["response_ids"] for u in t["turns"])]  # env_error: neither success nor failure
    rewards = torch.tensor([t["reward"] for t in trajs], dtype=torch.float32)
    adv, zero_var = mgrpo.group_advantages(rewards, [(t["task"], t["seed"]) for t in trajs])
    for i, t in enumerate(trajs):
        if "advantage" in t:
            adv[i] = t["advantage"]
    stats = {"rollout/reward": float(rewards.mean()) if len(trajs) else 0.0, "rollout/zero_var_groups": zero_var}
    samples = [(i, u["prompt_ids"], u["response_ids"]) for i, t in enumerate(trajs) for u in t["turns"] if u["response_ids"]]
    # a turn with no reply token has an all-zero loss mask: skipped (it would divide by zero), and counted
    stats["loss/empty_samples"] = sum(1 for t in trajs for u in t["turns"] if not u["response_ids"])
    if samples:
        # M-GRPO token weights over every trajectory (mgrpo.token_weights: each trajectory counts equally)
        lengths = torch.tensor([len(r) for _, _, r in samples])
        full = (torch.arange(int(lengths.max()))[None] < lengths[:, None]).float()  # (M, Lmax)
        tok_w = mgrpo.token_weights(full, torch.tensor([i for i, _, _ in samples]))[:, 0].tolist()  # weight of one action token
    # Only trajectories with a nonzero advantage move the loss (without a KL term): skipping the
    # others' forward and backward passes changes nothing but the time taken.
    live = [i for i in range(len(trajs)) if float(adv[i]) != 0.0 or (args.kl_coef > 0 and args.loss == "mgrpo")]
    by_traj = {}
    for k, (i, _, _) in enumerate(samples):
        by_traj.setdefault(i, []).append(k)
    n_updates = args.ppo_epochs * args.minibatches
    old = {}
    if n_updates > 1 and live:  # pi_old must be the sampling-time policy: score once before any update
        model.eval()
        with torch.no_grad():
            for mb in micro_batches(live, by_traj, args.micro_batch):
                lp, _, L = score(model, tok, [samples[k] for k in mb], args, device)
                for j, k in enumerate(mb):
                    old[k] = lp[j, L - len(samples[k][2]):]  # this sample's reply tokens only
    model.train()
    agg = {"loss/policy": 0.0, "loss/ratio": 0.0, "loss/clip_frac": 0.0, "loss/kl": 0.0}
    if nll_coef:  # the same keys on every rank, with or without expert samples of its own (all_mean)
        agg["loss/nll"] = 0.0
    rng = random.Random(len(samples) * 1_000_003 + len(trajs))
    shares = 0.0  # ratio, clip fraction and KL are averaged with the weight each micro-batch carries
    for epoch in range(args.ppo_epochs):
        perm = live[:]
        rng.shuffle(perm)
        for k_mb, chunk in enumerate([perm[k::args.minibatches] for k in range(args.minibatches)]):
            nll_chunk = nll[k_mb::args.minibatches]
            # Every rank runs the same number of optimizer steps and collectives, with or without
            # work of its own (average_gradients gives a rank without gradients zeros).
            if all_sum(len(chunk) + len(nll_chunk), world) == 0:
                # No rank has a trajectory with signal: stepping AdamW on zero gradients would still
                # move the weights along its stale moments. Every rank takes this branch together.
                continue
            for mb in micro_batches(chunk, by_traj, args.micro_batch):
                batch = [samples[k] for k in mb]
                logp, rm, L = score(model, tok, batch, args, device)  # (B, L)
                if n_updates > 1:
                    old_lp = torch.zeros_like(logp)  # right-aligned like logp; padding stays masked
                    for j, k in enumerate(mb):
                        old_lp[j, L - len(old[k]):] = old[k]
                else:
                    old_lp = logp.detach()  # one update from the sampling policy: pi_old = pi exactly
                local = {i: j for j, i in enumerate(dict.fromkeys(i for i, _, _ in batch))}
                if args.loss == "gspo":
                    loss, s = gspo.gspo_loss(logp, old_lp, adv[list(local)].to(device), rm,
                                             torch.tensor([local[i] for i, _, _ in batch], device=device),
                                             num_traj=max(1, len(trajs)) / args.minibatches,
                                             clip_low=args.clip_low, clip_high=args.clip_high)
                    share = s["n"] / max(1, len(live))
                else:
                    ref_lp = None
                    if ref is not None:
                        with torch.no_grad():
                            ref_lp, _, _ = score(ref, tok, batch, args, device)
                    # weights sum to 1 over the batch; each of the minibatches is ~1/minibatches of it
                    w = rm * torch.tensor([tok_w[k] * args.minibatches for k in mb], device=device)[:, None]
                    a = torch.tensor([float(adv[i]) for i, _, _ in batch], device=device)
                    loss, s = mgrpo.mgrpo_loss(logp, old_lp, a, w, clip_low=args.clip_low, clip_high=args.clip_high,
                                               ref_logp=ref_lp, kl_coef=args.kl_coef)
                    share = s["weight"]
                (loss * rl_scale).backward()
                agg["loss/policy"] += loss.item() / n_updates
                agg["loss/ratio"] += s["ratio"] * share
                agg["loss/clip_frac"] += s["clip_frac"] * share
                agg["loss/kl"] += s.get("kl", 0.0) * share
                shares += share
            n_nll_tok = sum(len(r) for _, r in nll_chunk)
            for mb in range(0, len(nll_chunk), args.micro_batch):  # real expert turns: -log p(reply)
                batch = [(None, p, r) for p, r in nll_chunk[mb:mb + args.micro_batch]]
                logp, rm, _ = score(model, tok, batch, args, device)
                loss = -(logp * rm).sum() / n_nll_tok
                (loss * nll_coef).backward()
                agg["loss/nll"] += loss.item() / n_updates
            average_gradients(model, world)
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            agg["loss/grad_norm"] = float(gnorm)
            agg["loss/updates"] = agg.get("loss/updates", 0) + 1
    for k in ("loss/ratio", "loss/clip_frac", "loss/kl"):
        agg[k] = agg[k] / shares if shares else (1.0 if k == "loss/ratio" else 0.0)
    stats.update(agg)
    stats["loss/trajectories_trained"] = len(live)
    return stats


def micro_batches(trajectories: list[int], by_traj: dict, size: int) -> list[list[int]]:
    """Sample indices in micro-batches of about `size` samples, never splitting a trajectory."""
    out, cur = [], []
    for i in trajectories:
        cur += by_traj.get(i, [])
        if len(cur) >= size:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def score(model, tok, batch, args, device):
    """Log-probs of each sample's reply tokens: (B, L) log-probs, (B, L) reply mask, L."""
    ids, mask, rm, L = policy.response_batch([p for _, p, _ in batch], [r for _, _, r in batch], tok.pad_token_id)
    with policy.autocast(device, bool(args.bf16)):
        logp = policy.token_logprobs(model, ids.to(device), mask.to(device), L, temperature=args.temperature)
    return logp.float(), rm.to(device), L


# ----------------------------------------------------------------------------- main
def restore_state(path: str, opt, state=None, rank: int = 0, model=None) -> int:
    """Load optimizer and this rank's RNG state from a checkpoint; return its step. With a sharded
    `model` (--fsdp) the saved full optimizer state (keyed by parameter name) is split to each
    rank's shards by torch.distributed.checkpoint."""
    state = state or torch.load(os.path.join(path, "trainer_state.pt"), weights_only=False)
    if model is not None and policy.is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, opt, optim_state_dict=state["optimizer"],
                                 options=StateDictOptions(full_state_dict=True))
    else:
        opt.load_state_dict(state["optimizer"])
    rngs = state["rng"]
    if rank < len(rngs):  # a run resumed on more ranks than it had keeps its seeding for the new ones
        r = rngs[rank]
        torch.set_rng_state(r["torch"])
        np.random.set_state(r["numpy"])
        random.setstate(r["python"])
        if "cuda" in r and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(r["cuda"])
    return int(state["step"])


def barrier(world):
    if world > 1:
        dist.barrier()


def print0(rank, *a):
    if rank == 0:
        print(*a, flush=True)


def main(argv=None):
    args = parse_args(argv)
    rank, world, device = setup_distributed()
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        if not args.resume and latest_checkpoint(args.out):
            print(f"note: {args.out} already holds checkpoints; pass --resume to continue from them", file=sys.stderr)
        with open(os.path.join(args.out, "args.json"), "w") as f:
            json.dump({k: v for k, v in vars(args).items()}, f, indent=1)
    barrier(world)
    logger = Logger(args.out, enabled=rank == 0)
    try:
        if args.mode in ("bc", "wm"):
            train_supervised(args, rank, world, device, logger)
        elif args.mode == "dream":
            train_dream(args, rank, world, device, logger)
        else:
            train_real(args, rank, world, device, logger)
    finally:
        logger.close()
        if world > 1:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
