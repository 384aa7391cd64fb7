"""Distributed plumbing: torchrun setup, reductions over ranks, gradient sync, and FSDP2 sharding.

    rank, world, device = setup_distributed()     # plain `python`: rank 0 of 1, no process group
    all_sum(3.0, world); all_mean({"a": 1.0}, world)
    sync_gradients(model, world)                  # every rank ends with the SUM of the ranks' gradients

Losses in this project are normalised by *global* counts (trajectories or tokens all-reduced over
the ranks, see update.py and supervised.py), so each rank's loss is its share of the global loss and
the ranks' gradients are summed, not averaged: uneven shares (env_error drops, dream groups dealt
round-robin) then weigh every trajectory and token the same as one process would.

Gradients are reduced in flat buckets (about BUCKET_MB each), one all-reduce per bucket, as DDP
does, instead of one collective per parameter tensor (about 270 a step for SmolLM2-135M). DDP itself
does not fit the RL step: ranks run different numbers of forward/backward passes.

FSDP2 (--fsdp) shards parameters, gradients and optimizer state over the ranks (`fully_shard` on
every decoder layer, then the root), for models that do not fit under plain data parallelism.
Supervised training (bc, wm) is plain FSDP: every rank runs the same number of forward passes, each
layer is gathered for its forward and backward and freed after. RL cannot work that way: each rank
generates and trains on its own trajectories, so ranks run different numbers of forward passes, and
FSDP's per-layer all-gathers (collectives) would deadlock. Inside `full_params(model, optimizer)`
every rank holds the full weights instead (generation needs them anyway), gradients accumulate
unreduced, and `reduce_sharded_grads` (called by sync_gradients) reduce-scatters them once per
optimizer step with one tiny forward/backward that every rank runs; the optimizer then steps the
shards and its post-step hook gathers the new full weights. What stays sharded there: optimizer
state and reduced gradients.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch
import torch.distributed as dist

BUCKET_MB = 25  # gradient all-reduce bucket size (DDP's default)


def setup_distributed() -> tuple[int, int, torch.device]:
    """(rank, world size, device). torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; plain `python` runs as
    rank 0 of 1. CPU: gloo, and the cores are shared between the node's processes. GPU: nccl for
    tensors on the GPU, gloo beside it for the metrics, which are reduced as CPU tensors."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    if world > 1:
        dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo")
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    else:
        torch.cuda.set_device(device)
    return rank, world, device


def all_sum(x: float, world: int) -> float:
    """The sum of a float over ranks (collective; the value itself when world == 1)."""
    if world == 1:
        return float(x)
    t = torch.tensor([float(x)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t)


def all_sums(values: list[float], world: int) -> list[float]:
    """Element-wise sums of a list of floats over ranks, in one collective."""
    if world == 1:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def all_mean(values: dict, world: int) -> dict:
    """Average a dict of floats over ranks (collective: every rank passes the same keys)."""
    if world == 1 or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return {k: float(v) / world for k, v in zip(keys, t)}


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def print0(rank: int, *a) -> None:
    if rank == 0:
        print(*a, flush=True)


def sync_gradients(model, world: int, bucket_mb: float = BUCKET_MB) -> None:
    """Sum the gradients over ranks, in flat buckets of about `bucket_mb` MB (one all-reduce each).

    A parameter without a gradient on this rank (it ran no backward) contributes zeros, so every
    rank issues the same collectives. Under --fsdp FSDP reduce-scatters the gradients itself, as a
    mean (its divide factor would need NCCL's PREMUL_SUM, which gloo lacks): they are multiplied
    back by the world size here. Collective: every rank calls it."""
    if is_sharded(model):
        reduce_sharded_grads(model)
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(world)
        return
    if world == 1:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    limit = bucket_mb * 2**20
    bucket, size = [], 0
    for p in params:
        bucket.append(p.grad)
        size += p.grad.numel() * p.grad.element_size()
        if size >= limit:
            _all_reduce_flat(bucket)
            bucket, size = [], 0
    if bucket:
        _all_reduce_flat(bucket)


def _all_reduce_flat(grads: list[torch.Tensor]) -> None:
    """All-reduce (sum) a list of tensors as one flat buffer per dtype and device, in place."""
    groups: dict = {}
    for g in grads:
        groups.setdefault((g.dtype, g.device), []).append(g)
    for group in groups.values():
        flat = torch.cat([g.reshape(-1) for g in group])
        dist.all_reduce(flat)
        k = 0
        for g in group:
            g.copy_(flat[k:k + g.numel()].view_as(g))
            k += g.numel()


# ----------------------------------------------------------------------------- sharding (FSDP2)
def unwrap(model):
    """The Hugging Face model inside a PEFT wrapper (PEFT's generate bypasses the wrapper's forward,
    so FSDP's root must be the inner model), else the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(unwrap(model), FSDPModule)


def holds_full(model) -> bool:
    """Whether a sharded model is inside `full_params` (every rank holds its full weights)."""
    return getattr(unwrap(model), "_webdream_full", False)


def shard(model):
    """FSDP2 in place: `fully_shard` every decoder layer (the classes in `_no_split_modules`), then
    the root (the model, or the model inside a PEFT wrapper). Needs an initialised process group
    (torchrun); parameters become DTensor shards. Errors: ValueError when no decoder layer is found."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    base = unwrap(model)
    names = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"--fsdp: no decoder layer found in {type(base).__name__} (its _no_split_modules is {names})")
    mesh = init_device_mesh(next(model.parameters()).device.type, (dist.get_world_size(),))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(base, mesh=mesh)
    return model


def _fsdp_modules(model):
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _gather(model, *_):
    for m in _fsdp_modules(model):
        m.unshard()


@contextmanager
def full_params(model, optimizer=None):
    """Hold the full weights on every rank inside the block (a no-op for an unsharded model).

    Collective: every rank enters and leaves together. Inside, forward passes, generation and
    backward passes run without any collective, so ranks may run different numbers of them;
    gradients accumulate unreduced until `sync_gradients`. With `optimizer`, each step is
    followed by a gather of the updated weights (a collective too: ranks step together).
    """
    if not is_sharded(model):
        yield model
        return
    root = unwrap(model)
    root.set_reshard_after_forward(False)
    root.set_reshard_after_backward(False)
    root.set_requires_gradient_sync(False)
    _gather(model)
    hook = optimizer.register_step_post_hook(lambda *_: _gather(model)) if optimizer is not None else None
    root._webdream_full = True
    try:
        yield model
    finally:
        root._webdream_full = False
        if hook is not None:
            hook.remove()
        for m in _fsdp_modules(model):
            m.reshard()
        root.set_requires_gradient_sync(True)
        root.set_reshard_after_backward(True)
        root.set_reshard_after_forward(True)
        root.set_reshard_after_forward(False, recurse=False)  # the root keeps its weights after forward (FSDP's default)


def reduce_sharded_grads(model) -> None:
    """Inside `full_params`: reduce-scatter the gradients accumulated since the last step, then
    drop the full weights so that the optimizer steps the shards (and clip_grad_norm_ sees the
    sharded gradients; it computes the global norm of DTensors correctly). One forward/backward of a
    one-token input with a zero loss, run by every rank, triggers FSDP's reduce-scatter (a mean) of
    every layer. Outside `full_params` FSDP has already reduced each backward's gradients: nothing to do."""
    if not holds_full(model):
        return
    root = unwrap(model)
    root.set_requires_gradient_sync(True)
    ids = torch.zeros((1, 1), dtype=torch.long, device=next(model.parameters()).device)
    with torch.enable_grad():
        (model(input_ids=ids, use_cache=False).logits.sum() * 0.0).backward()
    root.set_requires_gradient_sync(False)
    for m in _fsdp_modules(model):
        m.reshard()


def regather_full(model) -> None:
    """Inside `full_params`, after an optimizer step that was skipped (update.StepGuard): gather the full
    weights again, which `reduce_sharded_grads` dropped and the optimizer's post-step hook did not
    gather back. Collective under FSDP; a no-op otherwise."""
    if holds_full(model):
        _gather(model)


def full_state_dict(model) -> dict:
    """The full model state dict on CPU, on rank 0 (empty elsewhere). Collective under FSDP."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
