"""Gradients out of train.policy_update, for tests that compare them: an optimizer stand-in that
records them, a one-call update, and a comparison over all parameters together."""
import torch

import train


class GradRecorder:
    """A stand-in optimizer for train.policy_update: each `step()` records every trainable
    parameter's gradient (`steps`: one {name: tensor} a step) and leaves the weights alone."""

    def __init__(self, model):
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.steps: list[dict] = []

    def step(self):
        self.steps.append({n: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                           for n, p in self.params})

    def zero_grad(self, set_to_none: bool = True):
        for _, p in self.params:
            p.grad = None


def update_grads(model, tok, trajs, *argv, **kw) -> tuple[list[dict], dict]:
    """One train.policy_update on this process (world 1), with train.py's arguments `argv` (--mode
    real unless they say otherwise) and no gradient clipping: (the gradient of each optimizer step, stats)."""
    argv = list(argv) if "--mode" in argv else ["--mode", "real", *argv]
    args = train.parse_args(argv + ["--max-grad-norm", "1e12"])
    opt = GradRecorder(model)
    stats = train.policy_update(model, None, opt, tok, trajs, args, "cpu", 1, **kw)
    return opt.steps, stats


def scaled(g: dict, c: float) -> dict:
    return {k: v * c for k, v in g.items()}


def summed(gs: list[dict]) -> dict:
    return {k: sum(g[k] for g in gs) for k in gs[0]}


def rel_error(a: dict, b: dict) -> float:
    """|a - b| / |b| over all parameters together (a gradient as {name: tensor})."""
    diff = sum(float(((a[k] - b[k]).double() ** 2).sum()) for k in b)
    return (diff / sum(float((b[k].double() ** 2).sum()) for k in b)) ** 0.5
