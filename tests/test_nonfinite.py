"""A non-finite gradient or loss is never applied (update.StepGuard), in every optimizer step the project takes.

One inf in a gradient (one bf16 overflow) used to reach AdamW: the norm logged inf, the step wrote NaN into
a weight tensor, the next step's norm was NaN and then every weight was; checkpoints saved the ruined model.
Here a gradient hook sets one entry of a real tiny model's gradient to inf during a real update (the RL
update, M-GRPO and GSPO; the bc step; the world-model refit): the step is skipped and counted, the weights
stay finite and unchanged, the next finite step trains, and a run that keeps skipping stops with an error.
"""
import os
import subprocess
import sys

import pytest
import torch

import policy
import runlog
import train
import update
from test_train import synthetic_trajectories

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def poison(model, when):
    """Set gradient entry [0, 0] of one weight to inf in the backward passes for which when(n) is true, n the
    1-based count of backward passes through it (as one overflowing bf16 product would)."""
    calls = [0]

    def hook(g):
        calls[0] += 1
        if not when(calls[0]):
            return g
        g = g.clone()
        g[0, 0] = float("inf")
        return g
    model.model.layers[0].mlp.down_proj.weight.register_hook(hook)


def weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def finite(model) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


@pytest.mark.parametrize("loss", ["mgrpo", "gspo"])
def test_an_inf_gradient_skips_the_rl_step_and_the_next_step_trains(tok, loss):
    model = policy.tiny_model(tok)
    args = train.parse_args(["--mode", "real", "--loss", loss, "--micro-batch", "2", "--lr", "1e-3"])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    guard = update.StepGuard(args.max_skipped_steps)
    on = {"inf": True}
    poison(model, lambda _: on["inf"])
    start = weights(model)
    stats = update.policy_update(model, opt, tok, synthetic_trajectories(tok), train.update_config(args), "cpu", 1,
                                 guard=guard)
    assert stats["loss/skipped_steps"] == 1 and stats["loss/updates"] == 0, stats
    assert stats["loss/grad_norm"] == float("inf")  # logged as it was: the skip is visible
    assert finite(model) and same(start, weights(model))  # nothing applied, not even to the other tensors
    assert not opt.state and guard.consecutive == 1  # AdamW's moments untouched too
    on["inf"] = False
    stats = update.policy_update(model, opt, tok, synthetic_trajectories(tok), train.update_config(args), "cpu", 1,
                                 guard=guard)
    assert stats["loss/skipped_steps"] == 0 and stats["loss/updates"] == 1 and torch.isfinite(
        torch.tensor(stats["loss/grad_norm"]))
    assert finite(model) and not same(start, weights(model))  # it trains normally
    assert guard.consecutive == 0 and guard.skipped == 1


def test_skips_in_a_row_across_updates_stop_the_run(tok):
    model = policy.tiny_model(tok)
    args = train.parse_args(["--mode", "real", "--micro-batch", "2", "--lr", "1e-3", "--max-skipped-steps", "3"])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    guard = update.StepGuard(args.max_skipped_steps)  # one for the run, as real.py and dream.py keep it
    on = {"inf": True}
    poison(model, lambda _: on["inf"])

    def one_update():
        return update.policy_update(model, opt, tok, synthetic_trajectories(tok), train.update_config(args), "cpu", 1,
                                    guard=guard)
    for bad in (True, True, False, True, True):  # a step taken resets the count of skips in a row
        on["inf"] = bad
        assert one_update()["loss/skipped_steps"] == int(bad)
    kept = weights(model)
    on["inf"] = True
    with pytest.raises(update.NonFiniteError, match=r"3 optimizer steps in a row .* --max-skipped-steps \(now 3"):
        one_update()
    assert finite(model) and same(kept, weights(model)) and guard.skipped == 5
    # a non-finite loss with a finite gradient is skipped too
    guard = update.StepGuard(2)
    p = torch.nn.Parameter(torch.ones(3))
    sgd = torch.optim.SGD([p], lr=0.1)
    p.grad = torch.ones(3)
    assert not guard.step(sgd, 1.0, float("nan"), 1) and p.grad is None and torch.equal(p.detach(), torch.ones(3))
    with pytest.raises(ValueError):
        update.StepGuard(0)
    with pytest.raises(SystemExit):
        train.parse_args(["--mode", "real", "--max-skipped-steps", "0"])


def test_the_bc_step_skips_an_inf_gradient_and_checkpoints_finite_weights(tmp_path, tok, demos):
    import checkpoint
    import supervised
    from safetensors.torch import load_file

    def run(out, *flags, poisoned=(1,)):
        args = train.parse_args(["--mode", "bc", "--tiny", "--demos", demos, "--tasks", "click-button", "--batch-size", "4",
                                 "--micro-batch", "2", "--epochs", "1", "--lr", "1e-3", "--save-every", "1", "--out",
                                 out, *flags])
        model = policy.tiny_model(tok)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        poison(model, lambda n: (n + 1) // 2 in poisoned)  # two micro-batches (backward passes) a step
        logger = runlog.Logger(out, enabled=True)
        try:
            supervised.train_supervised(args, model, tok, opt, logger, 0, 0, 1, "cpu")
        finally:
            logger.close()
        return model

    start = policy.tiny_model(tok).state_dict()
    out = str(tmp_path / "bc")
    model = run(out)  # 8 demos, batches of 4: two steps, the first poisoned
    ms = runlog.read_jsonl(os.path.join(out, "metrics.jsonl"))
    assert [(m["loss/skipped_steps"], m["loss/grad_norm"] == float("inf")) for m in ms] == [(1, True), (0, False)]
    first = load_file(os.path.join(out, "step-000001", "model.safetensors"))  # saved after the skipped step
    assert all(torch.isfinite(v).all() and torch.equal(v, start[k]) for k, v in first.items())
    assert finite(model) and not all(torch.equal(v, start[k]) for k, v in model.state_dict().items())
    # --max-skipped-steps 1: the first poisoned step stops the run, before any checkpoint
    out = str(tmp_path / "stop")
    with pytest.raises(update.NonFiniteError, match="--mode bc: 1 optimizer steps in a row"):
        run(out, "--max-skipped-steps", "1")
    assert checkpoint.latest_checkpoint(out) is None


def test_the_world_model_refit_skips_an_inf_gradient(tok):
    import transitions as trans
    import wm_refit

    base = trans.load_transitions(os.path.join(ROOT, "tests", "data", "transitions.jsonl"))
    model = policy.tiny_model(tok, seed=2)
    refit = wm_refit.WorldModelRefit(model, tok, base, lr=1e-2, batch_size=4, micro_batch=2, max_skipped=2)
    on = {"inf": True}
    poison(model, lambda _: on["inf"])
    model.eval().requires_grad_(False)  # as the dream loop freezes it between refits
    new = [t for t in base if t["task"] == "enter-text"]
    start = weights(model)
    m = refit.refit(new, 1)
    assert m["wm_refit/skipped_steps"] == 1 and finite(model) and same(start, weights(model))
    on["inf"] = False
    assert refit.refit(new, 1)["wm_refit/skipped_steps"] == 0 and finite(model) and not same(start, weights(model))
    on["inf"] = True
    kept = weights(model)
    with pytest.raises(update.NonFiniteError, match="world-model refit: 2 optimizer steps in a row"):
        refit.refit(new, 3)
    assert finite(model) and same(kept, weights(model))
    assert not model.training and not any(p.requires_grad for p in model.parameters())  # back to dreaming


RANKS_CHECK = r'''
import datetime, os
import torch, torch.distributed as dist
import distributed, policy, update
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))  # a rank left waiting fails, not hangs
rank, world = dist.get_rank(), dist.get_world_size()
tok = policy.load_tokenizer()
x = torch.randint(3, 1000, (2, 8), generator=torch.Generator().manual_seed(rank))

def grads(model):
    model(input_ids=x, labels=x).loss.backward()
    distributed.sync_gradients(model, world)
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))

# plain data parallel: rank 1 alone has a NaN loss (its gradient is finite): both ranks skip, then both step
model = policy.tiny_model(tok)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
guard = update.StepGuard(3)
start = [p.detach().clone() for p in model.parameters()]
took = guard.step(opt, grads(model), float("nan") if rank == 1 else 1.0, world, model)
assert not took and all(torch.equal(a, b) for a, b in zip(start, model.parameters())), rank
assert guard.step(opt, grads(model), 1.0, world, model) and guard.consecutive == 0
# FSDP inside full_params (the RL path): a skipped step gathers the full weights again, so that rank 0 alone
# can go on generating (no collective) as the optimizer's post-step hook would have allowed
model = distributed.shard(policy.tiny_model(tok))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
with distributed.full_params(model, opt):
    assert not guard.step(opt, grads(model), float("nan") if rank == 1 else 1.0, world, model)
    if rank == 0:
        with torch.no_grad():
            model(input_ids=x)
    dist.barrier()
    assert guard.step(opt, grads(model), 1.0, world, model)
print("RANKS-CHECK-OK", rank, flush=True)
dist.barrier()
del model, opt
import gc
gc.collect()
dist.destroy_process_group()
os._exit(0)
'''


def test_every_rank_skips_when_one_ranks_loss_is_not_finite(tmp_path):
    script = tmp_path / "ranks_check.py"
    script.write_text(RANKS_CHECK)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(script)], cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT},
                       capture_output=True, text=True, timeout=300)
    assert r.stdout.count("RANKS-CHECK-OK") == 2, r.stdout[-3000:] + r.stderr[-3000:]
