"""Two processes train as one: losses normalised by global counts, gradients summed in buckets.

Under torchrun each rank holds its own share of the batch. With uneven shares (env_error drops,
dream groups dealt round-robin) every trajectory and every token must still weigh what it weighs
in one process holding the whole batch: the 2-process gradient of update.policy_update (M-GRPO in
each aggregation mode, GSPO, the NLL term) and of the supervised loss equals the single-process one.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT + os.pathsep + os.path.join(ROOT, "tests")}

CHECK = r'''
import datetime, sys
import torch, torch.distributed as dist
import distributed, policy, update
from grads import GradRecorder, rel_error
from test_train import PAGE, LONG_PAGE, trajectory

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
tok = policy.load_tokenizer()
# rank 0: one whole group of 3 and a 2-turn member; rank 1: one group of 2 (uneven shares)
shares = [[trajectory(tok, 0, 1.0, ["click('12')"], PAGE), trajectory(tok, 0, 0.0, ["click('13')", "noop()"], PAGE),
           trajectory(tok, 0, 0.0, ["noop()"], PAGE)],
          [trajectory(tok, 1, 1.0, ["click('12')"], LONG_PAGE), trajectory(tok, 1, 0.0, ["press('12', 'Enter')"], LONG_PAGE)]]
nll = [[(t["turns"][0]["prompt_ids"], t["turns"][0]["response_ids"]) for t in shares[0][:1]],
       [(t["turns"][0]["prompt_ids"], t["turns"][0]["response_ids"]) for t in shares[1]]]

def grads(trajs, cfg, world_, nll_=None):
    model = policy.tiny_model(tok)
    opt = GradRecorder(model)
    update.policy_update(model, opt, tok, trajs, cfg, "cpu", world_, nll=nll_, nll_coef=0.5 if nll_ else 0.0, seed=1)
    return opt.steps

checks = 0
for loss, agg in [("mgrpo", "trajectory"), ("mgrpo", "turn"), ("mgrpo", "token"), ("gspo", "trajectory")]:
    for with_nll in (False, True):
        cfg = update.UpdateConfig(loss=loss, aggregation=agg, micro_batch=2, max_grad_norm=1e12,
                                  clip_low=0.2 if loss == "mgrpo" else 3e-4, clip_high=0.2 if loss == "mgrpo" else 4e-4)
        two = grads(shares[rank], cfg, world, nll[rank] if with_nll else None)
        one = grads(shares[0] + shares[1], cfg, 1, nll[0] + nll[1] if with_nll else None)
        assert len(two) == len(one) == 1, (len(two), len(one))
        err = rel_error(two[0], one[0])
        assert err < 1e-5, (loss, agg, with_nll, err)
        checks += 1
# the supervised loss (bc) too: replies of uneven lengths, so the ranks' target tokens differ; SGD (the LR
# schedule needs a torch optimizer) records each step's gradient before stepping
import json, os, shutil, tempfile
import runlog, supervised, train

class SGDRecorder(torch.optim.SGD):
    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.steps = []

    def step(self, closure=None):
        self.steps.append({i: p.grad.detach().clone() for i, p in enumerate(self.param_groups[0]["params"])})
        return super().step(closure)

tmp = tempfile.mkdtemp()
demos = os.path.join(tmp, "demos.jsonl")
with open(demos, "w") as f:
    for i in range(4):  # 0, 1, 4 and 9 repeats: every split over two ranks has uneven token counts
        reply = "<think>" + "the OK button " * (i * i) + "</think>click('12')"
        f.write(json.dumps({"task": "click-button", "seed": i, "success": True, "reward": 1.0, "env_error": False,
                            "turns": [{"observation": PAGE, "action": "click('12')", "response": reply}]}) + "\n")

def bc_grads(rank_, world_, out):
    args = train.parse_args(["--mode", "bc", "--tiny", "--demos", demos, "--tasks", "click-button", "--batch-size", "4",
                             "--micro-batch", "1", "--epochs", "1", "--out", out, "--max-grad-norm", "1e12"])
    model = policy.tiny_model(tok)
    opt = SGDRecorder(model.parameters(), lr=1e-3)
    supervised.train_supervised(args, model, tok, opt, runlog.Logger(out, enabled=False), 0, rank_, world_, "cpu")
    return opt.steps

two, one = bc_grads(rank, world, os.path.join(tmp, "two")), bc_grads(0, 1, os.path.join(tmp, "one"))
assert len(two) == len(one) == 1, (len(two), len(one))
err = rel_error(two[0], one[0])
assert err < 1e-5, ("bc", err)
checks += 1
shutil.rmtree(tmp, ignore_errors=True)
# the bucketed all-reduce sums: a tiny bucket size (many buckets) gives the same sum as one bucket
model = policy.tiny_model(tok)
for p in model.parameters():
    p.grad = torch.full_like(p, float(rank + 1))
distributed.sync_gradients(model, world, bucket_mb=0.01)
assert all(torch.equal(p.grad, torch.full_like(p, 3.0)) for p in model.parameters())
sys.stdout.write(f"DIST-CHECK-OK {rank} {checks}\n")  # one write: the two ranks share the pipe
sys.stdout.flush()
dist.destroy_process_group()
'''


def test_two_ranks_with_uneven_shares_give_the_single_process_gradient(tmp_path):
    script = tmp_path / "dist_check.py"
    script.write_text(CHECK)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(script)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert r.stdout.count("DIST-CHECK-OK") == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert "DIST-CHECK-OK 0 9" in r.stdout
