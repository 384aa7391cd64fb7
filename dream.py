"""DynaWeb's loop (--mode dream): GSPO on imagined rollouts mixed with real expert trajectories.

    python train.py --mode dream --init runs/bc/final --world-model runs/wm/final --real-ratio 0.4 --dream-len 5

Each iteration: imagined groups, G dreams per (task, seed), run by rollout.py on world_model.DreamEnv
(the same asynchronous collector as real mode; a dream starts from a real page at any stage of a
recorded episode, its earlier turns as the prompts' history, and runs at most --dream-len imagined
steps; the reward is the world model's `done: yes`, or with --dream-reward judge the trajectory
judge's verdict on the finished dream, judge.py, or with judge-p its P(yes) itself), plus real expert trajectories at --real-ratio of
the batch, then one policy update (update.py; GSPO by default). Every --replay-every iterations a
few dreams are replayed on real pages (transitions.replay) to check the dream reward; those
replays are the only real browser steps the loop takes (env/real_steps, apart from dream/steps), with
--probe-seeds' greedy probe of the start policy before the first iteration (probe_tasks). Every
imagined trajectory goes to dreams-rank{R}.jsonl (dream_record), the replays to dream_replays.jsonl.
With --wm-refit-steps K the replays' real transitions also train the world model K steps (wm_refit.py).
"""
from __future__ import annotations

import json
import os
import random
import time

from tqdm import tqdm

import checkpoint
import distributed
import env as webenv
import policy
import report
import rollout as rollouts
import supervised
import trajectory_metrics
import transitions
import update
import wm_refit
from runlog import open_text, read_jsonl, truncate_jsonl


def dream_batch(args, it: int, rank: int, world: int, demos: list[dict],
                dream_tasks: list[str] | None = None) -> tuple[list[tuple[str, int]], list[dict]]:
    """This rank's share of iteration `it`'s batch: (dream jobs, real expert trajectories).

    The batch holds about groups_per_iter * group_size trajectories: round(real_ratio * that) real
    expert trajectories of every task (--expert-draw stratified: supervised.expert_deal, each task in
    turn and no demo twice in a pass; random: drawn independently), and the rest as imagined
    groups of G dreams each, (task, seed) cycling through `dream_tasks` (default args.tasks; with
    --probe-seeds the tasks the probe left in: probe_tasks); the seed picks a real start state.
    Expert trajectories and groups are dealt round-robin over ranks (groups never straddle ranks).
    """
    tasks = dream_tasks or args.tasks
    total = args.groups_per_iter * args.group_size
    n_real = round(args.real_ratio * total)
    n_groups = round((total - n_real) / args.group_size)
    rng = random.Random(args.seed * 1_000_003 + it)  # the same draw on every rank
    groups = [(tasks[(it * n_groups + g) % len(tasks)], rng.choice(webenv.TRAIN_SEEDS))
              for g in range(n_groups)]  # cycle through the tasks: every one gets its turn
    if getattr(args, "expert_draw", "stratified") == "random":  # (the draw of runs before d9)
        real = [demos[rng.randrange(len(demos))] for _ in range(n_real)] if demos else []
    else:
        real = supervised.expert_deal(demos, n_real, it, args.seed)
    jobs = [job for job in groups[rank::world] for _ in range(args.group_size)]
    return jobs, real[rank::world]


def collect_dreams(args, it: int, rank: int, jobs: list[tuple[str, int]], gen, tok, pool, tasks: list[str],
                   judge_model, judge_tok, device) -> tuple[list[dict], list[dict], dict, dict]:
    """This rank's dreams of iteration `it`, rewarded (reward_dreams): (dreams to train on, every dream
    rolled out, rollout counts summed over draws, judge figures over every dream).

    `jobs` (dream_batch's: G consecutive copies of each (task, seed)) are rolled out first. Without
    --dynamic-sampling every group is trained on as drawn. With CAP, real.collect's rule (DAPO's dynamic
    sampling): a group whose G rewards are all equal (advantage 0 for each member) is set aside, and
    more groups, (task, seed) drawn at random from `tasks` with fresh seeds, are rolled out until as
    many groups as `jobs` holds have signal or CAP times that many were drawn; each later draw is
    enlarged by the share of groups that had signal so far (at least 0.2). counts gain
    sampling/groups_drawn and sampling/groups_kept."""
    import math

    import curriculum

    G = args.group_size
    need = len(jobs) // G
    cap = max(need, int(args.dynamic_sampling * need)) if args.dynamic_sampling else need
    rng = random.Random((args.seed * 1_000_003 + it) * 1_009 + rank)  # each rank its own extra groups
    kept, rolled, rstats, judged = [], [], {}, []
    batch, drawn, with_signal = jobs, 0, 0
    while batch:
        trajs, st = rollouts.rollout(gen, tok, pool, batch, temperature=args.temperature,
                                     max_new_tokens=args.max_new_tokens, prompt=args.prompt,
                                     source="dream", progress=rank == 0, desc=f"dream {it}" + (f" +{drawn // need}" if drawn else ""))
        js = reward_dreams(trajs, judge_model, judge_tok, args, device)
        if js:
            judged.append(js)
        for k, v in st.items():
            rstats[k] = rstats.get(k, 0.0) + v
        rolled += trajs
        drawn += len(batch) // G
        keep, _ = curriculum.split_by_signal(trajs, G)
        with_signal += len(keep)
        kept += keep if args.dynamic_sampling else [trajs[k:k + G] for k in range(0, len(trajs), G)]
        if not args.dynamic_sampling or len(kept) >= need or drawn >= cap:
            break
        more = min(cap - drawn, math.ceil((need - len(kept)) / max(with_signal / drawn, 0.2)))
        batch = [g for g in ((rng.choice(tasks), rng.choice(webenv.TRAIN_SEEDS)) for _ in range(more)) for _ in range(G)]
    n = sum(j["judge/n"] for j in judged)
    jstats = {k: sum(j[k] * j["judge/n"] for j in judged) / n if n else 0.0 for k in (judged[0] if judged else {})
              if k != "judge/n"}
    if judged:
        jstats["judge/n"] = n
    if args.dynamic_sampling:
        rstats.update({"sampling/groups_drawn": drawn, "sampling/groups_kept": min(len(kept), need)})
    return [t for g in kept[:need] for t in g], rolled, rstats, jstats


def probe_tasks(args, gen, tok, rank: int, world: int) -> tuple[list[str], dict[str, tuple[int, int]], int]:
    """--probe-seeds in dream mode: the tasks dreams are drawn from. The start policy runs greedily on
    real pages (real.probe: --probe-seeds training seeds of every task), and the tasks it solves on
    every probe episode are left out of the dreams (real.leave_out_solved's rule: none when that would
    leave no task); expert trajectories still come from every task. A dream group on a task the policy
    already solves has G equal rewards, advantage 0, and teaches nothing (measured 2026-12-03: 28 of
    30 groups of a dream run over all 15 tasks; docs/dreams.md).
    Returns (tasks left in, in args.tasks order; {task: (successes, valid episodes)}; real browser
    steps the probe took, summed over ranks). Collective: every rank calls it."""
    import functools

    import curriculum
    import real

    pool = rollouts.EnvPool(functools.partial(webenv.WebEnv, max_steps=args.max_steps), tok, num_envs=args.num_envs,
                            step_timeout=args.step_timeout, processes=args.env_workers == "process")
    try:
        probed, steps = real.probe(args, gen, tok, pool, rank, world)
    finally:
        pool.close()
    cur = curriculum.Curriculum(args.tasks, args.group_size)
    real.leave_out_solved(cur, probed, args.probe_seeds)
    return cur.drawable(), probed, steps


def replay_dreams(trajs: list[dict], states: list[dict], renv_holder: list, args, it: int) -> tuple[dict, int, list[dict]]:
    """Replay a sample of dreams' actions on real pages (transitions.replay) and compare the world
    model's completion judgement (the dream reward) with the real reward.

    Returns (counts, real browser steps taken, records). counts: replayed (dreams replayed without
    an env_error), matched (whose start page was reproduced exactly on real pages), and, among the
    matched only, contradiction (predicted success, the dream's reward, differs from the real one),
    false_success (predicted success that did not happen), real_failures (the replays that did not
    succeed), done_false_positive and judge_false_positive (of those, the ones the world model's
    `done: yes`, or the judge (--dream-reward judge), called a success); train_dream sums them over
    ranks into rates. Records (for the HTML report): the dream with each turn's `real_observation`,
    `predicted_success` / `real_success`, and `real_transitions` (wm_refit.replay_transitions: what
    --wm-refit-steps trains the world model on; the replay env records hidden content only then).
    """
    rng = random.Random(args.seed * 7919 + it)
    pool = [t for t in trajs if not t["env_error"] and t["turns"]]
    sample = rng.sample(pool, min(args.replay_samples, len(pool)))
    counts = dict.fromkeys(["contradiction", "false_success", "matched", "replayed", "real_failures",
                            "done_false_positive", "judge_false_positive"], 0)
    steps = 0
    out = []
    refit = bool(getattr(args, "wm_refit_steps", 0))  # then the pages as the world model's training pages were recorded
    for t in sample:
        start = transitions.pick_start_state(states, t["seed"], t["task"])
        if start.get("seed") is None:
            continue
        if not renv_holder:
            renv_holder.append(webenv.WebEnv(t["task"], max_steps=max(30, len(start["prefix"]) + args.dream_len + 1),
                                             hidden=refit, action_timeout_ms=transitions.COLLECT_ACTION_TIMEOUT_MS
                                             if refit else None))
        r = transitions.replay(start, [u["response"] for u in t["turns"]], env=renv_holder[0])
        steps += r["steps"]
        if r["env_error"]:
            continue
        counts["replayed"] += 1
        if r["start_match"]:  # otherwise the real outcome says nothing about the world model
            counts["matched"] += 1
            counts["contradiction"] += int(r["success"] != t["success"])
            counts["false_success"] += int(t["success"] and not r["success"])
            if not r["success"]:
                counts["real_failures"] += 1
                counts["done_false_positive"] += int(t.get("done_success", t["success"]))
                counts["judge_false_positive"] += int(t.get("judge_p", 0.0) > args.judge_threshold)
        turns = [{k: v for k, v in u.items() if k not in _TOKEN_KEYS} for u in t["turns"]]
        obs_after = r["observations"] + [None] * (len(turns) - len(r["observations"]))
        # turn k shows the page the agent acted on; the real page after step k-1 is its counterpart
        for k, u in enumerate(turns):
            u["real_observation"] = u["observation"] if k == 0 else obs_after[k - 1]
        t["replayed"] = True  # the report shows the record (with the real pages) instead
        out.append({**{k: v for k, v in t.items() if k != "turns"}, "turns": turns, "iteration": it,
                    "predicted_success": t["success"], "real_success": r["success"],
                    "start_match": r["start_match"], "start": {k: start[k] for k in ("task", "seed", "prefix")},
                    "real_transitions": wm_refit.replay_transitions(t, start, r, it) if refit else []})
    return counts, steps, out


_TOKEN_KEYS = ("prompt_ids", "response_ids", "response_logprobs")


def dream_record(t: dict, iteration: int, group: int) -> dict:
    """One imagined trajectory as a line of dreams-rank{R}.jsonl: its task, seed, reward (and
    done_success, judge_p where set), group (G consecutive dreams of one rank's batch share one) and
    turns (observation, response, action, error), without token ids: what a reader needs to see what
    the policy was rewarded for, iteration by iteration."""
    turns = [{k: v for k, v in u.items() if k not in _TOKEN_KEYS} for u in t.get("turns", [])]
    return {**{k: v for k, v in t.items() if k not in ("turns", *_TOKEN_KEYS)}, "iteration": iteration,
            "group": group, "turns": turns}


def reward_dreams(trajs: list[dict], judge_model, judge_tok, args, device) -> dict:
    """Each dream's reward, in place: every finished dream keeps the world model's verdict as
    done_success; with --dream-reward judge the judge's verdict replaces its success and reward
    (judge.judge_dreams; its figures are returned), with judge-p its P(yes) is the reward (graded) and
    P(yes) > --judge-threshold the success; else `done: yes` stays the reward ({}). The judge's prompts get
    the budget it was trained with (judge.trained_budget; the run's --max-prompt-tokens without one)."""
    for t in trajs:
        if not t["env_error"]:
            t["done_success"] = bool(t["success"])
    if args.dream_reward == "done" or judge_model is None:
        return {}
    import judge

    return judge.judge_dreams(judge_model, judge_tok, trajs, threshold=args.judge_threshold,
                              max_tokens=judge.trained_budget(args.judge, args.max_prompt_tokens),
                              bf16=bool(args.bf16) and device.type == "cuda",
                              graded=args.dream_reward == "judge-p", **judge.judge_view(args.judge))


def dream_update(model, opt, tok, trajs: list[dict], real: list[dict], args, cfg: update.UpdateConfig, device,
                 world: int, seed: int, ref=None, rolled: list[dict] | None = None, planned: int | None = None,
                 guard: update.StepGuard | None = None) -> dict:
    """One policy update on this rank's imagined trajectories plus its real expert trajectories.
    rolled: every dream rolled out this iteration (default `trajs`; more under --dynamic-sampling),
    over which the logged dream reward (rollout/reward) is taken. planned: this rank's dream slots in
    the batch (len(jobs); default the dreams in `trajs` without env_error): the experts' share below
    counts them, so that dynamic sampling, which may keep fewer groups, leaves it at the real ratio.
    guard: the run's update.StepGuard (policy_update's), which skips a step with a non-finite gradient or loss.

    How real expert trajectories enter the loss. Default (--expert-loss nll): a likelihood term
    weighted by their share of the batch, loss = (1 - share) * L_gspo + share * L_nll. An expert
    trajectory has no group of its own: every one succeeds, so a group-normalised advantage would
    be zero and it would teach nothing; the likelihood term keeps the policy on real pages'
    behaviour whatever the world model gets wrong, which is what the real data is there for.
    --expert-loss gspo instead makes them GSPO samples with advantage 1 - (mean dream reward):
    off-policy, clipped by the sequence ratio like every other sample. --expert-loss kl keeps the
    share's weight but makes the term KL(ref || policy) of the next-token distributions along the
    experts' replies (update.policy_update's nll_ref; `ref` is the run's start): it holds the start
    policy's behaviour on real pages without pulling toward replies the start policy did not learn,
    such as choose-list's demos whose target is already selected (the expert clicks Submit at once),
    whose likelihood term turned the first choose-list reply into a click on Submit (docs/dreams.md).
    """
    dreams = [t for t in trajs if not t["env_error"]]
    live = dreams if rolled is None else [t for t in rolled if not t["env_error"]]  # the logged reward's dreams
    n_dream, n_real, dream_reward, n_slots, n_live, live_reward = distributed.all_sums(
        [len(dreams), len(real), sum(t["reward"] for t in dreams), len(dreams) if planned is None else planned,
         len(live), sum(t["reward"] for t in live)], world)
    expert_share = n_real / max(1.0, n_real + n_slots)
    nll, expert_trajs = [], []
    if args.expert_loss == "kl" and ref is None:
        raise ValueError("--expert-loss kl needs the reference model (train.py builds it for this flag)")
    if args.expert_loss in ("nll", "kl"):
        nll = [s for t in real for s in supervised.expert_turns(t, tok, args)]
    else:
        base = dream_reward / n_dream if n_dream else 0.0
        for k, t in enumerate(real):
            turns = [{"prompt_ids": p, "response_ids": r} for p, r in supervised.expert_turns(t, tok, args)]
            expert_trajs.append({"task": t["task"], "seed": f"expert-{k}", "turns": turns,
                                 "reward": 1.0, "success": True, "env_error": False, "advantage": 1.0 - base})
    stats = update.policy_update(model, opt, tok, trajs + expert_trajs, cfg, device, world, ref=ref, nll=nll,
                                 nll_coef=expert_share if args.expert_loss != "gspo" else 0.0,
                                 rl_scale=1.0 - expert_share if args.expert_loss != "gspo" else 1.0, seed=seed,
                                 nll_ref=ref if args.expert_loss == "kl" else None, guard=guard)
    # the dream reward: dreams only (every one rolled out), whatever the loss does with the expert trajectories
    stats["rollout/reward"] = live_reward / max(1.0, n_live)
    stats.update({"dream/trajectories": n_live, "dream/real_trajectories": n_real, "dream/real_share": expert_share})
    return stats


def train_dream(args, model, tok, opt, gen, logger, cfg: update.UpdateConfig, it: int, extra: dict,
                rank: int, world: int, device, ref=None) -> None:
    """--mode dream from iteration `it` (0, or the resumed checkpoint's; `extra` its counters) to
    args.iterations. Reads the dream-mode flags (real_ratio, dream_len, world_model, transitions,
    demos, expert_loss, replay_every, replay_samples) and the RL ones (groups_per_iter, group_size,
    num_envs, step_timeout, temperature, max_new_tokens, prompt settings, save_every, keep_ckpts,
    max_skipped_steps: update.StepGuard for the policy's steps and the world-model refit's) and
    the reward's (dream_reward, judge, judge_threshold): with --dream-reward judge each finished dream
    is rewarded by the trajectory judge (judge.judge_dreams), the world model's `done:` only ends it."""
    import world_model

    real_steps, dream_steps = extra.get("env_steps", 0), extra.get("dream_steps", 0)
    demos = supervised.expert_trajectories(args.demos, args.tasks) if args.real_ratio > 0 else []
    if args.real_ratio > 0 and not demos:
        raise ValueError(f"{args.demos} holds no successful expert trajectory for tasks {args.tasks}")
    pool, server, states, judge_model, judge_tok, refit = None, None, [], None, None, None
    refit_path = os.path.join(args.out, f"{os.path.splitext(wm_refit.REFIT_TRANSITIONS)[0]}-rank{rank}.jsonl")
    if args.real_ratio < 1:
        if not os.path.exists(args.transitions):
            raise FileNotFoundError(f"--transitions {args.transitions} not found (dream start states): write it with "
                                    "`python world_model.py --collect runs/transitions.jsonl`")
        states = [s for s in transitions.start_states(read_jsonl(args.transitions),
                                                       max_stage=args.dream_max_stage)
                  if s["task"] in args.tasks]
        missing = sorted(set(args.tasks) - {s["task"] for s in states})
        if missing:
            raise ValueError(f"{args.transitions} has no start state of task(s) {missing}")
        world_model.check_delta_format(args.world_model)
        wm_path = args.world_model
        if args.wm_refit_steps and it:  # resumed: dream in the refit world model saved with this checkpoint
            wm_path = os.path.join(checkpoint.latest_checkpoint(args.out) or args.out, wm_refit.REFIT_DIR)
            saved_at = wm_refit.refit_iteration(wm_path)
            if saved_at is None:
                raise FileNotFoundError(f"{wm_path}: no refit world model to resume in (--wm-refit-steps saves one "
                                        f"inside every checkpoint; runs before 2026-12-06 kept it at "
                                        f"{os.path.join(args.out, wm_refit.REFIT_DIR)}: move it there if its "
                                        f"refit.json says iteration {it})")
            if saved_at != it:
                raise ValueError(f"{wm_path} was refit up to iteration {saved_at}, the checkpoint resumed is at {it}: "
                                 f"a policy resumes only with the world model saved with it")
        wm, wm_tok = policy.load_model(wm_path, device=device)
        if args.wm_refit_steps:  # before freezing: it trains what load_model left trainable (a PEFT adapter)
            refit = wm_refit.WorldModelRefit(
                wm, wm_tok, [t for t in read_jsonl(args.transitions) if t["task"] in args.tasks], lr=args.wm_refit_lr,
                batch_size=args.wm_refit_batch, micro_batch=args.micro_batch, max_tokens=args.max_prompt_tokens,
                bf16=bool(args.bf16), seed=args.seed * 31 + it + rank, world=world, max_skipped=args.max_skipped_steps)
            truncate_jsonl(refit_path, "iteration", it)  # a log: lines past a resumed iteration are redone
        wm.eval().requires_grad_(False)
        # one Δ server: the steps of every waiting dream are generated in one batched call
        server = world_model.DeltaServer(wm, wm_tok, bf16=bool(args.bf16) and device.type == "cuda",
                                         max_batch=args.num_envs, max_prompt_tokens=args.max_prompt_tokens)
        # A dream step waits for a batch of up to num_envs Δs (DeltaServer), so its time limit scales
        # with them; a dream has no page that can hang.
        pool = rollouts.EnvPool(lambda task: world_model.DreamEnv(wm, wm_tok, states, args.dream_len, server=server,
                                                                      max_prompt_tokens=args.max_prompt_tokens,
                                                                      done_threshold=args.done_threshold),
                                tok, num_envs=args.num_envs, step_timeout=args.step_timeout * args.num_envs)
        if args.dream_reward != "done":
            judge_model, judge_tok = policy.load_model(args.judge, device=device)
            judge_model.eval().requires_grad_(False)
    distributed.print0(rank, f"dream: {args.iterations} iterations, real ratio {args.real_ratio}, dream length "
                             f"{args.dream_len}, loss {args.loss}, expert loss {args.expert_loss}, world {world}")
    renv: list = []  # one real browser for the replay checks, opened on first use
    replays_path = os.path.join(args.out, "dream_replays.jsonl")
    dreams_path = os.path.join(args.out, f"dreams-rank{rank}.jsonl")  # every imagined trajectory, each rank its own
    if it:  # resumed: like metrics.jsonl, drop what is redone (and a line cut by the kill)
        if rank == 0:
            truncate_jsonl(replays_path, "iteration", it)
        truncate_jsonl(dreams_path, "iteration", it)
    settings = args.prompt_settings

    def refit_companion(iteration: int) -> dict:
        """save_checkpoint's arguments that put the refit world model inside the checkpoint (wm_refit.py)."""
        if refit is None:
            return {}

        def write(path):
            with world_model._PREDICT_LOCK:  # the tokenizer's state is shared with the Δ server's thread
                wm_refit.save_refit(path, wm, wm_tok, args.world_model, iteration)
        return {"companions": {wm_refit.REFIT_DIR: write}, "companion_bytes": checkpoint.checkpoint_bytes(wm, None)}

    dream_tasks = extra.get("dream_tasks") or list(args.tasks)  # resumed: the probe's choice, not re-run
    guard = update.StepGuard(args.max_skipped_steps, what="policy update")  # skips in a row count across iterations
    try:
        if it == 0 and args.probe_seeds and args.real_ratio < 1:
            with distributed.full_params(model, opt):
                dream_tasks, probed, probe_steps = probe_tasks(args, gen, tok, rank, world)
            real_steps += probe_steps
            from real import probe_metrics  # `real` names this loop's expert trajectories

            logger.log(probe_metrics(probed, args.probe_seeds), 0)
            distributed.print0(rank, f"probe ({args.probe_seeds} greedy episodes a task on real pages, {probe_steps} "
                                     f"steps): dreams on {', '.join(dream_tasks)}")
        bar = tqdm(total=args.iterations, initial=it, desc="dream", disable=rank != 0)
        while it < args.iterations:
            t0 = time.time()
            jobs, real = dream_batch(args, it, rank, world, demos, dream_tasks)
            train, trajs, rstats, jstats = [], [], {}, {}  # the dreams trained on; every dream rolled out
            with distributed.full_params(model, opt):  # --fsdp: full weights on every rank through rollout and update
                if jobs:
                    train, trajs, rstats, jstats = collect_dreams(args, it, rank, jobs, gen, tok, pool, dream_tasks,
                                                                  judge_model, judge_tok, device)
                os.makedirs(args.out, exist_ok=True)
                with open_text(dreams_path, "a") as f:
                    for k, t in enumerate(trajs):
                        f.write(json.dumps(dream_record(t, it + 1, k // args.group_size)) + "\n")
                lstats = dream_update(model, opt, tok, train, real, args, cfg, device, world,
                                      seed=args.seed * 1_000_003 + it, ref=ref, rolled=trajs,
                                      planned=len(jobs) if args.dynamic_sampling else None, guard=guard)
            gen.push_weights(model)  # the next rollout samples from the updated policy
            dreams = [t for t in trajs if not t["env_error"]]
            replay_c, steps_now, replays = {}, 0, []
            if args.replay_every and (it + 1) % args.replay_every == 0 and args.real_ratio < 1:  # every rank together
                replay_c, steps_now, replays = replay_dreams(dreams, states, renv, args, it + 1)
            refit_m = {}
            if refit is not None and args.replay_every and (it + 1) % args.replay_every == 0:  # every rank together
                new = [x for r in replays for x in r.pop("real_transitions")]
                os.makedirs(args.out, exist_ok=True)
                with open_text(refit_path, "a") as f:
                    for x in new:
                        f.write(json.dumps(x) + "\n")
                with world_model._PREDICT_LOCK:  # no Δ is being generated between rollouts; held to be sure
                    refit_m = refit.refit(new, args.wm_refit_steps)
            for r in replays:
                r.pop("real_transitions", None)
            it += 1
            real_steps += int(distributed.all_sum(steps_now, world))
            dream_steps += int(distributed.all_sum(rstats.get("env_steps", 0), world))
            m = {**distributed.all_mean({**trajectory_metrics.rollout_metrics(trajs, rstats), **jstats}, world), **lstats,
                 **refit_m}
            if replay_c:  # every rank replays at the same iterations, so these collectives match
                c = dict(zip(sorted(replay_c), distributed.all_sums([replay_c[k] for k in sorted(replay_c)], world)))
                m.update({"dream/replayed": c["replayed"], "dream/replay_start_match": c["matched"] / max(1, c["replayed"]),
                          "dream/replay_contradiction": c["contradiction"] / max(1, c["matched"]),
                          "dream/replay_false_success": c["false_success"] / max(1, c["matched"]),
                          "dream/replay_real_failures": c["real_failures"],
                          "dream/replay_done_false_positive_rate": c["done_false_positive"] / max(1, c["real_failures"])})
                if args.dream_reward != "done":
                    m["dream/replay_judge_false_positive_rate"] = c["judge_false_positive"] / max(1, c["real_failures"])
            m.update({"env/real_steps": real_steps, "dream/steps": dream_steps, "perf/iter_s": time.time() - t0})
            logger.log(m, it)
            if rank == 0 and replays:
                with open_text(replays_path, "a") as f:
                    for r in replays:
                        f.write(json.dumps(r) + "\n")
            bar.update(1)
            bar.set_postfix(success=f"{m['rollout/success']:.2f}", clip=f"{m.get('loss/clip_frac', 0):.4f}")
            if rank == 0 and report.due(args.report_every, it, args.iterations):
                report.write_run_report(args.out, replays + [t for t in trajs if not t.get("replayed")], it, args.mode)
            counters = {"env_steps": real_steps, "dream_steps": dream_steps, "dream_tasks": dream_tasks}
            if it % args.save_every == 0 or it == args.iterations:
                checkpoint.save_checkpoint(args.out, f"step-{it:06d}", model, tok, opt, it, counters, args.keep_ckpts,
                                           rank, world, settings, **refit_companion(it))
        bar.close()
        checkpoint.save_checkpoint(args.out, "final", model, tok, opt, it, {"env_steps": real_steps,
                                   "dream_steps": dream_steps, "dream_tasks": dream_tasks}, args.keep_ckpts, rank,
                                   world, settings, **refit_companion(it))
    finally:
        if pool is not None:
            pool.close()
        if server is not None:
            server.close()
        for e in renv:
            e.close()


if __name__ == "__main__":
    import sys

    sys.exit("dream.py is the dream loop (python train.py --mode dream); the replay of a run's dreams on real pages "
             "moved: python dream_replay.py RUN/dreams-rank0.jsonl [--judge CKPT] [--labelled FILE]")
