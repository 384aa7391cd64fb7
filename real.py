"""WebAgent-R1's real-page loop (Sec. 3.2): each iteration draws (task, seed) groups from the
curriculum, rolls G trajectories of each out in real headless Chromium (rollout.py, every prompt
compressed by compress.py), keeps the groups with signal (dynamic sampling), takes one M-GRPO
policy update on them (update.py), then logs, evaluates greedily on a fixed set of eval episodes
when due, writes a report and checkpoints. With --probe-seeds, a greedy probe of the start policy
first leaves out the tasks it already solves (probe).

    real.train_real(args, model, tok, opt, gen, logger, cfg, it, extra, rank, world, device, ref=ref)

train.py builds everything it takes (flags, model, optimizer, generator, logger, reference model);
dream.py is the DynaWeb counterpart.
"""
from __future__ import annotations

import functools
import math
import os
import random
import sys
import time

from tqdm import tqdm

import benchmarks
import checkpoint
import curriculum
import distributed
import env as webenv
import report
import supervised
import rollout as rollouts
import runlog
import trajectory_metrics
import update

def collect(args, cur: curriculum.Curriculum, gen, tok, pool, it: int, rank: int, world: int) -> tuple[list, list, dict]:
    """This rank's rollouts of iteration `it`: (trajectories to train on, every trajectory rolled out,
    counts). Groups come from the curriculum, G rollouts each. With dynamic sampling, groups whose
    rewards are all equal are set aside and more are drawn until groups_per_iter / world groups have
    signal, or CAP times that many were drawn; the first draw already allows for the share expected
    to have none. Without it, the groups are trained on as drawn."""
    need = args.groups_per_iter // world
    rng = random.Random((args.seed * 1_000_003 + it) * 1_009 + rank)  # each rank its own groups
    cap = max(need, int(args.dynamic_sampling * need)) if args.dynamic_sampling else need
    kept, rolled, counts = [], [], {"groups_drawn": 0, "groups_kept": 0}
    rstats: dict = {}
    while len(kept) < need and counts["groups_drawn"] < cap:
        missing = need - len(kept)
        if args.dynamic_sampling:  # over-draw by the signal rate seen so far (or expected)
            rate = counts["groups_kept"] / counts["groups_drawn"] if counts["groups_drawn"] else cur.signal_share()
            missing = min(cap - counts["groups_drawn"], math.ceil(missing / max(rate, 0.2)))
        groups = cur.draw(missing, rng)
        jobs = [g for g in groups for _ in range(args.group_size)]
        trajs, st = rollouts.rollout(gen, tok, pool, jobs, temperature=args.temperature,
                                     max_new_tokens=args.max_new_tokens, prompt=args.prompt, progress=rank == 0,
                                     desc=f"rollout {it}")
        for k, v in st.items():
            rstats[k] = rstats.get(k, 0.0) + v
        rstats["ungrounded_successes"] = rstats.get("ungrounded_successes", 0.0) + \
            trajectory_metrics.shape_rewards(trajs, args.reward)  # before anything reads the rewards
        cur.update(trajs)
        rolled += trajs
        keep, _ = curriculum.split_by_signal(trajs, args.group_size)
        counts["groups_drawn"] += len(groups)
        counts["groups_kept"] += len(keep)
        kept += keep if args.dynamic_sampling else [trajs[k:k + args.group_size] for k in range(0, len(trajs), args.group_size)]
        if not args.dynamic_sampling:
            break
    return [t for g in kept[:need] for t in g], rolled, {**counts, **rstats}


def greedy_eval(args, gen, tok, pool, it: int, rank: int, world: int) -> dict:
    """Greedy success on the first --eval-seeds eval seeds of every task (the same episodes every
    time; WebArena-Lite: its test tasks once each), each rank a share of them, the share of
    greedy turns repeating the previous action (a loop: sampling breaks them, greedy decoding does
    not) and of thoughts naming an element the page does not have at their bid (ungrounded_thought);
    trajectories to out/evals/iter-XXXXXX.jsonl (rank 0's share)."""
    import stats

    seeds = benchmarks.eval_seeds(args.benchmark, args.eval_seeds if args.benchmark == "miniwob" else 1)
    jobs = [(t, s) for t in args.eval_tasks for s in seeds][rank::world]
    trajs, _ = rollouts.rollout(gen, tok, pool, jobs, temperature=0.0, max_new_tokens=args.max_new_tokens,
                                prompt=args.prompt, progress=rank == 0, desc=f"eval {it}")
    s = stats.summarise(trajs, args.eval_tasks)["mean"]
    repeats = [x for t in trajs if not t["env_error"] for x in trajectory_metrics.repeated_actions(t)]
    ungrounded = [g for t in trajs if not t["env_error"] for u in t["turns"]
                  if (g := trajectory_metrics.ungrounded_thought(u)) is not None]
    n, k, err, n_rep, k_rep, n_th, k_th = distributed.all_sums(
        [s["n"], s["successes"], s["env_error"], len(repeats), sum(repeats), len(ungrounded), sum(ungrounded)], world)
    if rank == 0:
        os.makedirs(os.path.join(args.out, "evals"), exist_ok=True)
        runlog.write_jsonl(os.path.join(args.out, "evals", f"iter-{it:06d}.jsonl"), [
            {k: v for k, v in t.items() if k != "turns"} | {"turns": [
                {k: v for k, v in u.items() if k not in ("prompt_ids", "screenshot")} for u in t["turns"]]}
            for t in trajs])
    lo, hi = stats.wilson(int(k), int(n))
    return {"eval/success": k / n if n else 0.0, "eval/ci_low": lo, "eval/ci_high": hi, "eval/n": n, "eval/env_error": err,
            "eval/repeated_action": k_rep / n_rep if n_rep else 0.0,
            "eval/ungrounded_thought": k_th / n_th if n_th else 0.0}


def probe(args, gen, tok, pool, rank: int, world: int) -> tuple[dict[str, tuple[int, int]], int]:
    """The start policy's greedy success on --probe-seeds training seeds of every task (the same seeds
    for each task, drawn from env.TRAIN_SEEDS with --seed; each rank a share). Returns ({task:
    (successes, episodes without env_error)}, real browser steps taken), both summed over ranks
    (collective: every rank calls it). train_real and dream.probe_tasks leave out the tasks solved on
    every probe episode (curriculum.Curriculum.leave_out) and count the steps as real steps."""
    seeds = random.Random(args.seed * 7_919 + 17).sample(webenv.TRAIN_SEEDS, args.probe_seeds)
    jobs = [(t, s) for t in args.tasks for s in seeds][rank::world]
    trajs, rstats = rollouts.rollout(gen, tok, pool, jobs, temperature=0.0, max_new_tokens=args.max_new_tokens,
                                     prompt=args.prompt, progress=rank == 0, desc="probe")
    import stats

    rows = stats.summarise(trajs, args.tasks)["tasks"]  # this rank's successes and valid episodes a task
    flat = distributed.all_sums([float(x) for t in args.tasks for x in (rows[t]["successes"], rows[t]["n"])]
                                + [float(rstats.get("env_steps", 0))], world)
    return {task: (int(flat[2 * i]), int(flat[2 * i + 1])) for i, task in enumerate(args.tasks)}, int(flat[-1])


def probe_metrics(probed: dict[str, tuple[int, int]], episodes: int) -> dict[str, float]:
    """probe()'s result as metrics logged at step 0: probe/success/TASK (successes over valid
    episodes, for the tasks with any) and probe/env_error/TASK (of `episodes` a task, those lost)."""
    return ({f"probe/success/{t}": k / n for t, (k, n) in probed.items() if n}
            | {f"probe/env_error/{t}": episodes - n for t, (k, n) in probed.items()})


def leave_out_solved(cur: curriculum.Curriculum, probed: dict[str, tuple[int, int]], episodes: int) -> list[str]:
    """Leave out of the curriculum the tasks solved on all `episodes` probe episodes (a task with an
    episode lost to env_error stays in: one lucky episode is no evidence); none when that would leave
    no task. Returns the tasks left out."""
    solved = [t for t, (k, n) in probed.items() if episodes and k == n == episodes]
    if set(solved) | set(cur.left_out) >= set(cur.tasks):
        return []
    cur.leave_out(solved)
    return solved


def bc_batch(args, demos: list[dict], cur: curriculum.Curriculum, tok, it: int, rank: int,
             world: int) -> list[tuple[list[int], list[int]]]:
    """This rank's behaviour-cloning samples for iteration `it` under --bc-coef: (prompt ids, reply ids)
    of every turn of --bc-trajectories / world (at least 1) expert trajectories of
    `demos` (successful ones, supervised.expert_trajectories; --expert-draw: dealt task by task,
    supervised.expert_deal, or drawn at random), only of the tasks the curriculum leaves
    out (those the start policy already solves), or of every task when it leaves none out. Their
    token-mean NLL enters each update with weight --bc-coef beside the M-GRPO loss (update.policy_update's
    `nll`): InstructGPT's PPO-ptx term (Ouyang et al. 2022, eq. 2), here anchoring the tasks RL does not
    sample, whose greedy actions otherwise drift through the shared weights (docs/rl.md, rl-e16).
    Prompts are built as in BC (supervised.expert_turns), so the anchor is the BC loss itself.
    Errors: ValueError when no demonstration of those tasks exists."""
    tasks = set(cur.left_out or cur.tasks)
    pool = [t for t in demos if t["task"] in tasks]
    if not pool:
        raise ValueError(f"--bc-coef: {args.demos} holds no successful expert trajectory for {sorted(tasks)}")
    per_rank = max(1, args.bc_trajectories // world)
    if getattr(args, "expert_draw", "stratified") == "random":  # (the draw of runs before d9)
        rng = random.Random((args.seed * 1_000_003 + it) * 7_907 + rank)
        picked = rng.sample(pool, min(len(pool), per_rank))
    else:  # every rank deals the same sequence and takes its share of it
        picked = supervised.expert_deal(pool, min(len(pool), per_rank) * world, it, args.seed)[rank::world]
    return [s for t in picked for s in supervised.expert_turns(t, tok, args)]


COLLAPSE_PARSE_ERROR = 0.2  # share of sampled replies that do not parse above which train_real warns (BC: 0.5-7%)


def train_real(args, model, tok, opt, gen, logger, cfg: update.UpdateConfig, it: int, extra: dict, rank: int, world: int,
               device, ref=None):
    """--mode real (WebAgent-R1): M-GRPO on trajectories collected in real headless Chromium, from
    iteration `it` (0, or the resumed checkpoint's) to args.iterations. Each iteration: groups drawn
    by the curriculum, G rollouts each (rollout.py, prompts compressed by compress.py), with dynamic
    sampling until enough groups have signal; one policy update on those (update.py); metrics, a
    greedy eval, a report and a checkpoint when due. A policy-update step with a non-finite gradient or loss
    is skipped (update.StepGuard, one for the run: args.max_skipped_steps skipped in a row, across
    iterations, raise update.NonFiniteError before anything more is checkpointed)."""
    env_steps = extra.get("env_steps", 0)
    cur = curriculum.Curriculum(args.tasks, args.group_size, uniform=args.curriculum == "uniform", rank=rank, world=world)
    cur.load(extra.get("curriculum", {}))
    # one long-lived browser per worker thread (or its child process), any task on each (rollout.py)
    pool = rollouts.EnvPool(functools.partial(webenv.WebEnv, max_steps=args.max_steps), tok, num_envs=args.num_envs,
                            step_timeout=args.step_timeout, processes=args.env_workers == "process")
    distributed.print0(rank, f"real: {args.iterations} iterations x {args.groups_per_iter} groups x G={args.group_size}, "
                             f"world {world}")
    demos = supervised.expert_trajectories(args.demos, args.tasks) if args.bc_coef else []
    if args.bc_coef and not demos:
        raise ValueError(f"--bc-coef: {args.demos} holds no successful expert trajectory for tasks {args.tasks}")
    guard = update.StepGuard(args.max_skipped_steps, what="policy update")
    evaluating = lambda i: args.eval_every and (i % args.eval_every == 0 or i == args.iterations)
    try:
        if it == 0 and args.probe_seeds:
            with distributed.full_params(model, opt):
                probed, probe_steps = probe(args, gen, tok, pool, rank, world)
            env_steps += probe_steps  # real browser steps too (not counted before 2026-12-03)
            solved = leave_out_solved(cur, probed, args.probe_seeds)
            logger.log(probe_metrics(probed, args.probe_seeds), 0)
            distributed.print0(rank, f"probe ({args.probe_seeds} greedy episodes a task): left out (solved on every "
                                     f"one): {', '.join(solved) or 'none'}; training on: {', '.join(cur.drawable())}")
        elif it > 0 and cur.left_out:
            distributed.print0(rank, f"resumed at iteration {it}: the probe is not re-run; left out: "
                                     f"{', '.join(cur.left_out)}")
        if it == 0 and evaluating(0):
            with distributed.full_params(model, opt):
                logger.log(greedy_eval(args, gen, tok, pool, 0, rank, world), 0)
        bar = tqdm(total=args.iterations, initial=it, desc="m-grpo", disable=rank != 0)
        while it < args.iterations:
            t0 = time.time()
            # screenshots (about 40 ms a step) only in iterations that write a report, which only rank 0 does
            pool.set_env_attr("screenshots", rank == 0 and report.due(args.report_every, it + 1, args.iterations))
            with distributed.full_params(model, opt):  # --fsdp: every rank holds the full weights through rollout and update
                trajs, rolled, rstats = collect(args, cur, gen, tok, pool, it, rank, world)
                t_update = time.time()
                nll = bc_batch(args, demos, cur, tok, it, rank, world) if demos else None
                lstats = update.policy_update(model, opt, tok, trajs, cfg, device, world, ref=ref, nll=nll,
                                              nll_coef=args.bc_coef if demos else 0.0, seed=args.seed * 1_000_003 + it,
                                              guard=guard)
                lstats["perf/update_s"] = time.time() - t_update
            gen.push_weights(model)  # the next rollout samples from the updated policy
            cur.merge(world)
            it += 1
            env_steps += int(distributed.all_sum(rstats.get("env_steps", 0), world))
            drawn, kept = distributed.all_sums([rstats["groups_drawn"], rstats["groups_kept"]], world)
            m = {**distributed.all_mean(trajectory_metrics.rollout_metrics(rolled, rstats), world), **lstats, **cur.metrics()}
            m.update({"env/real_steps": env_steps, "sampling/groups_drawn": drawn, "sampling/groups_kept": kept,
                      "sampling/signal_share": kept / max(1.0, drawn)})
            if evaluating(it):
                with distributed.full_params(model, opt):
                    m.update(greedy_eval(args, gen, tok, pool, it, rank, world))
            m["perf/iter_s"] = time.time() - t0
            logger.log(m, it)
            bar.update(1)
            bar.set_postfix(success=f"{m['rollout/success']:.2f}", kept=f"{int(kept)}/{int(drawn)}",
                            unparsed=f"{m['rollout/parse_error']:.0%}")
            if rank == 0 and m["rollout/parse_error"] > COLLAPSE_PARSE_ERROR:
                print(f"warning: iteration {it}: {m['rollout/parse_error']:.0%} of the sampled replies are not an "
                      f"action (the BC start: a few %); the policy may be collapsing (see docs/rl.md): watch "
                      f"eval/success (--eval-every), lower --lr or --minibatches", file=sys.stderr)
            if rank == 0 and report.due(args.report_every, it, args.iterations):
                report.write_run_report(args.out, rolled, it, args.mode)
            state = {"env_steps": env_steps, "curriculum": cur.state()}
            if it % args.save_every == 0 or it == args.iterations:
                checkpoint.save_checkpoint(args.out, f"step-{it:06d}", model, tok, opt, it, state, args.keep_ckpts,
                                           rank, world, args.prompt_settings)
        bar.close()
        checkpoint.save_checkpoint(args.out, "final", model, tok, opt, it, {"env_steps": env_steps,
                                   "curriculum": cur.state()}, args.keep_ckpts, rank, world, args.prompt_settings)
    finally:
        pool.close()
