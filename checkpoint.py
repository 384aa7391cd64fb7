"""Checkpoints: written atomically, resumed exactly.

A checkpoint is a Hugging Face folder (safetensors weights, tokenizer) plus trainer_state.pt
(optimizer state, step, every rank's RNG state, loop-specific extras) and webdream.json (the
prompt settings the model was trained with, which eval.py reads). `out/latest` names the newest.

    save_checkpoint(out, "step-000005", model, tok, opt, 5, {"env_steps": 123}, keep=2, rank, world, settings)
    path = latest_checkpoint(out)            # None when there is none
    step, extra = restore_state(path, opt, rank, model)   # optimizer + this rank's RNG

Resuming from a checkpoint draws the random numbers an uninterrupted run would have drawn: each
rank's torch, numpy and Python RNG states are gathered when saving and restored when resuming.
"""
from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import torch
import torch.distributed as dist

import distributed
import runlog


def rng_state() -> dict:
    """This process's torch, numpy, Python (and CUDA) RNG states."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` returned."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_bytes(model, optimizer) -> int:
    """Bytes a checkpoint of `model` and `optimizer` takes on disk, about: every parameter at its dtype's
    size (a PEFT model's adapter only: what its save_pretrained writes) plus every tensor of the optimizer's state (Adam: two fp32 moments a parameter; None: none). Global sizes
    under --fsdp (a DTensor's numel is the full tensor's)."""
    from peft import PeftModel, get_peft_model_state_dict

    # a PEFT model's save_pretrained writes its adapter only
    saved = get_peft_model_state_dict(model).values() if isinstance(model, PeftModel) else model.parameters()
    n = sum(p.numel() * p.element_size() for p in saved)
    for state in (optimizer.state.values() if optimizer is not None else ()):
        n += sum(v.numel() * v.element_size() for v in state.values() if torch.is_tensor(v))
    return n


def check_disk(out: str, need: int, name: str, free: int) -> None:
    """Raise OSError, before anything is written, when `free` bytes (on the file system holding `out`) are
    less than `need` plus 5%: a half-written checkpoint is a lost one, and the error says how much is
    missing and that the newest complete checkpoint (out/latest) is intact for --resume."""
    if free < need * 1.05:
        latest = latest_checkpoint(out)
        raise OSError(28, f"not enough disk to write checkpoint {name} in {out}: it needs about {need / 1e9:.2f} GB, "
                          f"{free / 1e9:.2f} GB are free. Nothing was written; "
                          + (f"the newest complete checkpoint is {latest}: free space (old run folders, "
                             f"--keep-ckpts) and rerun with --resume" if latest else "no checkpoint exists yet"))


def save_checkpoint(out: str, name: str, model, tokenizer, optimizer, step: int, extra: dict, keep: int,
                    rank: int = 0, world: int = 1, settings: dict | None = None,
                    companions: dict | None = None, companion_bytes: int = 0) -> None:
    """Write out/name atomically (a temp folder, then rename) and point out/latest at it; keep only
    the newest `keep` step-* folders.

    companions: {subfolder: write(path)}, what belongs with these weights (dream mode's refit world
    model): rank 0 calls each write with out/name/subfolder's path inside the temp folder, so it lands
    in the same rename as the weights and a resumed run finds the pair as it was saved. Its size,
    companion_bytes, counts in the disk check.

    Collective: every rank calls it (each rank's RNG state is gathered so that a resumed run
    draws what an uninterrupted one would); rank 0 writes. `settings` (the prompt format the
    model was trained with) goes to webdream.json, which eval.py reads.

    Raises OSError (errno 28) on every rank, before writing, when out's disk lacks room for the
    checkpoint (`check_disk`; rank 0's reading of the free space is broadcast, so all ranks agree).
    A write that fails part-way (an error or an interrupt) removes its temp folder and re-raises; the
    newest complete checkpoint and out/latest stay as they were. Under several ranks rank 0's error is
    broadcast: rank 0 re-raises it and every other rank raises RuntimeError naming it.
    """
    os.makedirs(out, exist_ok=True)
    free = [shutil.disk_usage(out).free]
    if world > 1:
        dist.broadcast_object_list(free, src=0)
    check_disk(out, checkpoint_bytes(model, optimizer) + companion_bytes, name, free[0])
    rngs = [None] * world
    if world > 1:
        dist.all_gather_object(rngs, rng_state())
    else:
        rngs = [rng_state()]
    weights = None  # None: save_pretrained takes the model's own state dict
    if distributed.is_sharded(model):  # --fsdp: gather full weights and optimizer state on rank 0 (collective)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        weights = distributed.full_state_dict(model)
        opt_state = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    failed = None  # rank 0's write error, which every rank raises (none is left waiting at a barrier)
    if rank == 0:
        final = os.path.join(out, name)
        tmp, old = final + ".tmp", final + ".old"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            model.save_pretrained(tmp, state_dict=weights)
            tokenizer.save_pretrained(tmp)
            # under --fsdp the optimizer state is keyed by parameter name (torch.distributed.checkpoint's full form)
            torch.save({"optimizer": optimizer.state_dict() if weights is None else opt_state, "step": step,
                        "extra": extra, "rng": rngs}, os.path.join(tmp, "trainer_state.pt"))
            with runlog.open_text(os.path.join(tmp, "webdream.json"), "w") as f:
                json.dump({"step": step, **(settings or {})}, f, indent=1)
            for sub, write in (companions or {}).items():
                write(os.path.join(tmp, sub))
        except Exception as e:  # a failed write (full disk) leaves no half folder behind
            shutil.rmtree(tmp, ignore_errors=True)
            failed = e
        except BaseException:  # Ctrl-C reaches every rank itself: no broadcast
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    if world > 1:
        said = [None if failed is None else f"{type(failed).__name__}: {failed}"]
        dist.broadcast_object_list(said, src=0)
        if rank != 0 and said[0] is not None:
            raise RuntimeError(f"rank 0 failed to write checkpoint {name} in {out} ({said[0]}); nothing of it was "
                               f"kept, the newest complete checkpoint (out/latest) is intact for --resume")
    if failed is not None:
        raise failed
    if rank == 0:
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(final):
            os.replace(final, old)  # never a moment with neither the old nor the new folder
        os.replace(tmp, final)
        with runlog.open_text(os.path.join(out, "latest.tmp"), "w") as f:
            f.write(name)
        os.replace(os.path.join(out, "latest.tmp"), os.path.join(out, "latest"))
        shutil.rmtree(old, ignore_errors=True)
        steps = sorted(d for d in os.listdir(out) if d.startswith("step-") and d[5:].isdigit())
        for d in steps[:-keep] if keep > 0 else []:
            shutil.rmtree(os.path.join(out, d), ignore_errors=True)
    distributed.barrier(world)


# The prompt format a model is trained with, stored with each checkpoint (webdream.json), and what a
# model without one (the base model, --tiny) gets. max_new_tokens None: 64 with think, else 32.
PROMPT_DEFAULTS = {"think": True, "bid_last": True, "keep_last": 1, "no_compress": False, "max_prompt_tokens": 1024,
                   "max_steps": 6, "max_new_tokens": None}


def saved_settings(path: str | None) -> dict | None:
    """Everything a checkpoint folder's webdream.json holds (its step and the settings train.py saved with
    it), or None when it has none (the base model, a hub id, a folder written elsewhere)."""
    f = os.path.join(path, "webdream.json") if path else ""
    if not f or not os.path.exists(f):
        return None
    with open(f) as fh:
        return json.load(fh)


def trained_settings(path: str | None) -> dict:
    """The prompt settings a checkpoint folder was trained with (its webdream.json), {} when it has none."""
    saved = saved_settings(path)
    if saved is None:
        return {}
    # checkpoints written before the bid_last setting existed were trained with the bid first
    return {"bid_last": False} | {k: v for k, v in saved.items() if k in PROMPT_DEFAULTS}


def resolve_prompt_settings(args, path: str | None, defaults: dict | None = None) -> None:
    """Fill every prompt flag left at None in `args` (argparse namespace) with the value checkpoint `path`
    was trained with, else `defaults` (a benchmark's, benchmarks.prompt_defaults), else PROMPT_DEFAULTS: a
    checkpoint is prompted the way it was trained unless a flag says otherwise."""
    trained = trained_settings(path)
    for k, v in PROMPT_DEFAULTS.items():
        if getattr(args, k, None) is None:
            setattr(args, k, trained.get(k, (defaults or {}).get(k, v)))
    if args.max_new_tokens is None:
        args.max_new_tokens = reply_budget(args.think)


def prompt_settings(args):
    """The compress.PromptSettings that the prompt flags in `args` (argparse namespace, after
    resolve_prompt_settings) name: keep_last, no_compress, max_prompt_tokens, think, bid_last, and benchmark
    where args has it (else MiniWoB's)."""
    import compress

    return compress.PromptSettings(keep_last=args.keep_last, compress=not args.no_compress,
                                   max_tokens=args.max_prompt_tokens, think=args.think,
                                   benchmark=getattr(args, "benchmark", "miniwob"), bid_last=args.bid_last)


def reply_budget(think: bool) -> int:
    """The default reply budget in tokens: 64 with a thought before the action, 32 without."""
    return 64 if think else 32


def latest_checkpoint(out: str) -> str | None:
    """The folder out/latest names, or None when there is none."""
    try:
        with open(os.path.join(out, "latest")) as f:
            path = os.path.join(out, f.read().strip())
        return path if os.path.isdir(path) else None
    except FileNotFoundError:
        return None


def restore_state(path: str, opt, rank: int = 0, model=None) -> tuple[int, dict]:
    """Load the optimizer state and this rank's RNG state from checkpoint `path`; return (step,
    extra). With a sharded `model` (--fsdp) the saved full optimizer state (keyed by parameter name)
    is split to each rank's shards by torch.distributed.checkpoint. A run resumed on more ranks than
    it had keeps its own seeding for the new ones."""
    state = torch.load(os.path.join(path, "trainer_state.pt"), weights_only=False)
    # keys a learning-rate scheduler added to the saved groups (initial_lr) must exist before loading
    for group, saved in zip(opt.param_groups, state["optimizer"].get("param_groups", [])):
        for k, v in saved.items():
            if k != "params":
                group.setdefault(k, v)
    if model is not None and distributed.is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, opt, optim_state_dict=state["optimizer"],
                                 options=StateDictOptions(full_state_dict=True))
    else:
        opt.load_state_dict(state["optimizer"])
    if rank < len(state["rng"]):
        set_rng_state(state["rng"][rank])
    return int(state["step"]), state.get("extra", {})
