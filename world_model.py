"""The Δ world model (DynaWeb, arXiv 2601.22149): o_{t+1} = apply(o_t, Δ), Δ ~ p(Δ | goal, o_t, a_t).

    python world_model.py --collect runs/transitions.jsonl --seeds 20                 # real transitions, train seeds
    python world_model.py --collect runs/wm_eval.jsonl --seeds 10 --eval-seeds       # held-out pages
    python world_model.py --collect runs/policy.jsonl --seeds 20 --policy runs/bc/final   # the BC policy's own samples
    python world_model.py --eval runs/wm/final --data runs/wm_eval.jsonl             # exact match, line F1, done acc.
    python world_model.py --compare A/wm_eval_predictions.jsonl B/wm_eval_predictions.jsonl   # paired: B - A

A language model is fine-tuned (train.py --mode wm, supervised.py) on -log p(Δ | goal, o_t, a_t)
over real transitions (transitions.py), Δ in the exact format of delta.py. Here: its prompts, its
greedy predictions and DreamEnv, an environment with WebEnv's interface whose pages the model
imagines. Its accuracy against real next pages, one step and k steps, is wm_eval.py's.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import checkpoint
import compress
import delta
import policy
from actions import ActionParseError, parse_action
from delta import apply, as_state, predicted_status, tree_lines
from env import Obs
from transitions import checkpoint_policy, collect_transitions, delta_label, history, pick_start_state

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------
# The model: p(Δ | goal, o_t, a_t)

# Short on purpose: it is in every world-model sequence.
WM_SYSTEM_PROMPT = ("Predict how the page changes after the action. Reply with "
                    + ("`focus: [bid]` if it moves, edits: " if delta.FOCUS_HEADER else "edits: ") + "`- REF` remove, "
                    "`~ LINE` change, `+ REF LINE` add after REF, `= REF LINE` then `| LINE`s replace REF's "
                    "subtree, then `done: yes|no|fail`.")


def delta_format() -> dict:
    """The Δ format this code writes (delta.FOCUS_HEADER and delta.TYPED_VALUES, module switches): what
    train.py --mode wm records in a world model's webdream.json, beside the prompt settings. Only the
    focus header must match to read a model's Δs (check_delta_format); apply reads typed values either way."""
    return {"delta_focus_header": bool(delta.FOCUS_HEADER), "delta_typed_values": bool(delta.TYPED_VALUES)}


def check_delta_format(path: str) -> None:
    """Refuse a world-model checkpoint trained on another Δ format than this code's: its prompt and
    its labels would disagree with what apply() reads. Errors: ValueError naming the setting, for a
    checkpoint whose webdream.json records a different one; a checkpoint without the record (written
    before it existed, or the base model) passes unchecked."""
    saved, k = checkpoint.saved_settings(path) or {}, "delta_focus_header"
    if k in saved and bool(saved[k]) != bool(delta.FOCUS_HEADER):
        raise ValueError(f"{path} was trained with {k} = {saved[k]}, this code writes and reads Δs with {k} = "
                         f"{bool(delta.FOCUS_HEADER)} (delta.FOCUS_HEADER): set it to match, or train a world model on this format")


def wm_messages(goal: str, obs, action: str, *, max_tree_lines: int | None = None) -> list[dict]:
    """Chat messages asking for Δ: system prompt, then goal, URL, tree, the page's hidden content (when
    observed: env.Obs.hidden, under a `Hidden:` line) and the action.
    max_tree_lines: show only the first lines of the tree (for a prompt token budget)."""
    s = as_state(obs)
    lines = tree_lines(s["axtree"])
    tree = "\n".join(lines[:max_tree_lines]) if max_tree_lines is not None else s["axtree"]
    hidden = f"\nHidden:\n{s['hidden']}" if s["hidden"] else ""
    user = f"Goal: {goal}\nURL: {s['url']}\n{tree}{hidden}\nAction: {action}"
    return [{"role": "system", "content": WM_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def wm_prompt(tokenizer, goal: str, obs, action: str, max_tokens: int = 1024) -> list[int]:
    """Prompt ids for Δ, at most `max_tokens` long: the tree is cut from its end when needed (the
    lines kept keep their REFs), then, with no tree line left, the hidden lines from their end.
    Raises ValueError if even an empty tree without hidden lines does not fit."""
    ids = compress.render(tokenizer, wm_messages(goal, obs, action))
    state = as_state(obs)
    n = len(tree_lines(state["axtree"]))
    while len(ids) > max_tokens:
        if n == 0:
            hidden = state["hidden"].split("\n") if state["hidden"] else []
            if not hidden:
                raise ValueError(f"max_tokens={max_tokens} cannot hold the world-model prompt without a tree")
            state = dict(state, hidden="\n".join(hidden[:-1]))  # then the hidden lines, from the end
        else:
            n = max(0, min(n - 1, n * max_tokens // len(ids)))
        ids = compress.render(tokenizer, wm_messages(goal, state, action, max_tree_lines=n))
    return ids


def wm_samples(transitions: list[dict], tokenizer, max_tokens: int = 1024) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target ids) per transition for train.py --mode wm, where the loss is
    -log p(Δ | goal, o_t, a_t) summed over the target tokens only (DynaWeb Sec. 3, Eq. 2).

    target = Δ's tokens (transitions.delta_label: today's diff) + the end-of-turn id (as in bc_samples). A
    transition whose prompt + target exceeds `max_tokens` is skipped (cutting the tree would make
    the label refer to lines the prompt no longer shows); the number skipped is logged.
    """
    out, skipped = [], 0
    for t in transitions:
        prompt = compress.render(tokenizer, wm_messages(t["goal"], t["obs"], t["action"]))
        target = compress.encode_reply(tokenizer, delta_label(t))
        if len(prompt) + len(target) > max_tokens:
            skipped += 1
            continue
        out.append((prompt, target))
    if skipped:
        logger.warning("wm_samples: skipped %d of %d transitions longer than %d tokens", skipped, len(transitions),
                       max_tokens)
    return out


def predict_delta(model, tokenizer, states: list, actions: list[str], max_new_tokens: int = 256, *,
                  goals: list[str] | None = None, max_prompt_tokens: int = 1024, batch_size: int = 8,
                  bf16: bool = False, progress: bool = False) -> list[str]:
    """Greedy Δ for each (state, action), batched through policy.generate.

    states: env.Obs or dicts with goal (unless `goals` is given), url and axtree. Returns the Δ
    texts. A reply cut by max_new_tokens loses its unfinished last line (a half line such as
    `~ [14] textbox value='My` would still apply, wrongly); with no `done:` line it reads as `done: no`.
    Opening a tab on click-tab-2 takes 145-175 Δ tokens as an `=` block (180-260 line by line, the
    labels before the block): keep max_new_tokens at 256 or more.
    """
    if not states:
        return []
    goals = goals if goals is not None else [as_state(s)["goal"] for s in states]
    prompts = [wm_prompt(tokenizer, g, s, a, max_prompt_tokens) for g, s, a in zip(goals, states, actions)]
    from tqdm import tqdm

    samples = []
    with tqdm(total=len(prompts), desc="Δ", disable=not progress, leave=False) as bar:
        for k in range(0, len(prompts), 4 * batch_size):  # chunks only for the progress bar
            chunk = prompts[k:k + 4 * batch_size]
            samples += policy.generate(model, tokenizer, chunk, max_new_tokens=max_new_tokens, temperature=0.0,
                                       batch_size=batch_size, bf16=bf16)
            bar.update(len(chunk))
    return [s.text.rsplit("\n", 1)[0] if s.truncated and "\n" in s.text else ("" if s.truncated else s.text)
            for s in samples]


# ----------------------------------------------------------------------------------------------
# Dreams

_PREDICT_LOCK = threading.Lock()


@dataclass
class DreamObs(Obs):
    """DreamEnv.reset's observation: an env.Obs plus `context`, the real episode so far at the start
    state ([{observation, response}], transitions.history), which rollout.py puts in the prompts'
    history (trajectory key `context`) and never trains on."""
    context: list = field(default_factory=list, repr=False, compare=False)


class DeltaServer:
    """One thread that generates the Δ of every waiting DreamEnv in one batched `predict_delta` call
    (rollout.py's dynamic batching, for the world model).

    predict(state, action) blocks its caller (a rollout worker thread) until the Δ is there. The
    server takes the first waiting request, waits up to `linger` seconds for others (at most
    `max_batch` in all), then generates them together, greedily: rows are padded on the left with
    their own positions, so each row's Δ is the one batch-1 generation gives (tests check it on a
    tiny model; floating-point sums in a batch can still differ in the last bits). An exception in
    generation is raised in every caller of that batch. stats: calls, requests, generate_s.
    close() ends the thread; requests after it raise RuntimeError.
    """

    def __init__(self, model, tokenizer, *, max_new_tokens: int = 256, max_prompt_tokens: int = 1024,
                 bf16: bool = False, max_batch: int = 16, linger: float = 0.02):
        self.model, self.tokenizer, self.max_batch, self.linger = model, tokenizer, max_batch, linger
        self.max_new_tokens, self.max_prompt_tokens, self.bf16 = max_new_tokens, max_prompt_tokens, bf16
        self.requests: "queue.Queue" = queue.Queue()
        self.stats = Counter()
        self.closed = False
        self.thread = threading.Thread(target=self._serve, daemon=True, name="delta-server")
        self.thread.start()

    def predict(self, state, action: str) -> str:
        """The greedy Δ for (state, action): state an env.Obs or a dict with goal, url and axtree."""
        if self.closed:
            raise RuntimeError("DeltaServer is closed")
        reply: "queue.Queue" = queue.Queue(maxsize=1)
        self.requests.put((state, action, reply))
        while True:
            try:
                out = reply.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.thread.is_alive() and reply.empty():  # closed after this request came in
                    raise RuntimeError("DeltaServer is closed") from None
        if isinstance(out, Exception):
            raise out
        return out

    def _serve(self) -> None:
        stop = False
        while not stop:
            first = self.requests.get()
            if first is None:
                break
            batch, deadline = [first], time.perf_counter() + self.linger
            while len(batch) < self.max_batch:
                try:
                    r = self.requests.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    break
                if r is None:
                    stop = True
                    break
                batch.append(r)
            t0 = time.perf_counter()
            try:
                with _PREDICT_LOCK:  # the model and its tokenizer (whose encode flags are shared state) are
                    # also used by DreamEnv's P(yes) check (done_threshold) from the rollout threads
                    out = predict_delta(self.model, self.tokenizer, [b[0] for b in batch], [b[1] for b in batch],
                                        self.max_new_tokens, max_prompt_tokens=self.max_prompt_tokens,
                                        batch_size=len(batch), bf16=self.bf16)
            except Exception as e:  # every caller of this batch gets the error; the server goes on
                out = [RuntimeError(f"Δ generation failed: {type(e).__name__}: {e}")] * len(batch)
            self.stats.update(calls=1, requests=len(batch), generate_s=time.perf_counter() - t0)
            for (_, _, reply), d in zip(batch, out):
                reply.put(d)
        while True:  # anyone still waiting learns that the server is gone
            try:
                r = self.requests.get_nowait()
            except queue.Empty:
                break
            if r is not None:
                r[2].put(RuntimeError("DeltaServer is closed"))

    def close(self) -> None:
        """Finish the batch in hand, then end the thread (a later predict raises RuntimeError)."""
        self.closed = True
        self.requests.put(None)
        self.thread.join(timeout=600)


class DreamEnv:
    """An environment with WebEnv's interface whose pages come from the world model (DynaWeb's
    imagined rollouts).

    reset(seed) starts from a real state (`start_states`, any stage of a real episode), chosen
    deterministically from the seed, and returns a DreamObs whose `context` is that episode's
    earlier pages and actions (transitions.history): rollout.py shows them to the policy as the
    prompt's history, so the first dream prompt is the one the policy sees at that stage on real
    pages. step(text) parses the action like WebEnv (a parse error costs a step, changes nothing and
    is shown as Obs.error), predicts Δ greedily and applies it. The episode ends when Δ says
    `done: yes` (reward 1) or `done: fail` (reward 0), or after `dream_len` steps (truncated).
    With `done_threshold` (a probability in (0, 1)), a `done: yes` counts only when the model's P(yes)
    over yes / no / fail, teacher-forced after its Δ lines on the page before the step
    (done_calibration.done_p_yes: one more forward pass, only on such steps), is above it; otherwise
    the step reads as `done: no` and the dream goes on. None (the default): the greedy line as it is
    (a greedy `yes` is the most likely token, so P(yes) over the three can be as low as a third).
    info: WebEnv's keys (action, error, success, env_error, raw_reward, truncated) plus delta,
    bad_lines, and p_yes (None unless a `yes` was checked against the threshold).

    Δ generation: with `server` (a DeltaServer shared by every DreamEnv of a rollout) the Δs of all
    waiting dreams are generated in one batched call; without it each step is its own batch-1
    generation, serialised by a process-wide lock (concurrent calls would only fight for the
    cores). `self.start` is the real state the current dream began from (with its seed, prefix
    and prefix_obs, for `replay`).
    """

    def __init__(self, model, tokenizer, start_states: list[dict], dream_len: int = 5, *, task: str | None = None,
                 max_new_tokens: int = 256, max_prompt_tokens: int = 1024, bf16: bool = False,
                 server: DeltaServer | None = None, done_threshold: float | None = None):
        states = [s for s in start_states if task is None or s.get("task") == task]
        if not states:
            raise ValueError(f"DreamEnv needs at least one start state{f' of task {task!r}' if task else ''}")
        if dream_len < 1:
            raise ValueError(f"dream_len must be >= 1, got {dream_len}")
        if done_threshold is not None and not 0.0 < done_threshold < 1.0:
            raise ValueError(f"done_threshold must be in (0, 1) or None, got {done_threshold}")
        tasks = {s.get("task") for s in states}
        self.task = task or (tasks.pop() if len(tasks) == 1 else None)
        self.model, self.tokenizer, self.states, self.dream_len = model, tokenizer, states, dream_len
        self.max_new_tokens, self.max_prompt_tokens, self.bf16 = max_new_tokens, max_prompt_tokens, bf16
        self.server, self.done_threshold = server, done_threshold
        self.state: dict | None = None
        self.seed: int | None = None
        self.goal = ""
        self.start: dict | None = None
        self.t = 0
        self.done = True

    def reset(self, seed: int, task: str | None = None) -> DreamObs:
        """Start a dream from the start state that `seed` picks (among those of `task`, when given).
        Raises ValueError if there is no start state of that task."""
        self.seed, self.t, self.done = seed, 0, False
        try:
            s = pick_start_state(self.states, seed, task)
        except ValueError:
            raise ValueError(f"DreamEnv has no start state of task {task!r}") from None
        self.start = s
        self.state = as_state(s)
        self.goal = self.state["goal"]
        if s.get("task"):
            self.task = s["task"]
        return DreamObs(self.goal, self.state["url"], self.state["axtree"], self.state["error"], 0, context=history(s))

    def _predict(self, action: str) -> str:
        if self.server is not None:
            return self.server.predict(self.state, action)
        with _PREDICT_LOCK:  # one Δ generation at a time: on CPU, concurrent calls only fight for cores
            return predict_delta(self.model, self.tokenizer, [self.state], [action], self.max_new_tokens,
                                 max_prompt_tokens=self.max_prompt_tokens, batch_size=1, bf16=self.bf16)[0]

    def step(self, text: str) -> tuple[Obs, float, bool, dict]:
        if self.done:
            raise RuntimeError("step() called on a finished episode; call reset(seed) first")
        self.t += 1
        info = {"action": None, "error": "", "success": False, "env_error": False, "raw_reward": 0.0,
                "truncated": False, "delta": "", "bad_lines": 0, "p_yes": None}
        try:
            action = parse_action(text)
        except ActionParseError as e:
            action, info["error"] = None, f"ActionParseError: {e}"
        status = "no"
        if action is not None:
            info["action"] = action
            delta = self._predict(action)
            before = self.state
            self.state, info["bad_lines"] = apply(self.state, delta, action=action)
            info["delta"], info["error"] = delta, self.state["error"]
            status = predicted_status(delta)
            if status == "yes" and self.done_threshold is not None:
                from done_calibration import done_p_yes  # lazily: done_calibration imports this module

                with _PREDICT_LOCK:  # the DeltaServer thread holds it while it generates
                    (info["p_yes"],) = done_p_yes(self.model, self.tokenizer,
                                                  [{"goal": self.goal, "obs": before, "action": action}], [delta],
                                                  max_prompt_tokens=self.max_prompt_tokens)
                status = "yes" if info["p_yes"] > self.done_threshold else "no"
        success = status == "yes"
        truncated = status == "no" and self.t >= self.dream_len
        self.done = status != "no" or truncated
        info.update(success=success, truncated=truncated, raw_reward={"yes": 1.0, "fail": -1.0}.get(status, 0.0))
        obs = Obs(self.goal, self.state["url"], self.state["axtree"], info["error"], self.t)
        return obs, (1.0 if success else 0.0), self.done, info

    def close(self) -> None:
        self.done = True


if __name__ == "__main__":
    import argparse

    import env as webenv

    ap = argparse.ArgumentParser(description="Collect real transitions for the world model, or evaluate one.")
    ap.add_argument("--collect", default=None, help="append transitions (JSONL) to this file")
    ap.add_argument("--tasks", default=",".join(webenv.SUITE), help="comma-separated MiniWoB tasks")
    ap.add_argument("--seeds", type=int, default=20, help="episodes per task")
    ap.add_argument("--seed-offset", type=int, default=0, help="--collect: start at this training seed (env.train_seeds; "
                    "more transitions beside a file collected from offset 0 with --seeds N: --seed-offset N)")
    ap.add_argument("--eval-seeds", action="store_true", help="use held-out EVAL seeds instead of train seeds")
    ap.add_argument("--random-frac", type=float, default=0.3, help="share of random actions among the expert's")
    ap.add_argument("--near-miss-frac", type=float, default=0.0, help="--collect: share of expert steps swapped for a "
                    "near miss (transitions.near_miss_action), half of them then submitted: finishes that fail")
    ap.add_argument("--max-steps", type=int, default=6, help="step limit per episode")
    ap.add_argument("--policy", default=None, help="--collect: a policy checkpoint acts instead of the scripted expert "
                    "(policy samples; random actions still at --random-frac)")
    ap.add_argument("--temperature", type=float, default=1.0, help="--policy: sampling temperature (0: greedy)")
    ap.add_argument("--eval", default=None, help="checkpoint folder of a world model to evaluate on --data")
    ap.add_argument("--data", default="runs/wm_eval.jsonl", help="transitions to evaluate on")
    ap.add_argument("--drift", type=int, default=5, help="measure k-step drift for k = 1..this")
    ap.add_argument("--out", default=None, help="where --eval writes its JSON (default <checkpoint>/wm_eval.json; its "
                    "predicted Δs beside it, <out>_predictions.jsonl)")
    ap.add_argument("--compare", nargs=2, metavar="PREDICTIONS", default=None,
                    help="two --eval predictions files (A B): B's paired gain in exact next pages, overall and per task")
    a = ap.parse_args()
    if a.seed_offset and a.eval_seeds:
        ap.error("--seed-offset takes training seeds; --eval-seeds are always the first --seeds of the held-out range")
    tasks = [t for t in a.tasks.split(",") if t]
    if not 0.0 <= a.near_miss_frac <= 1.0:
        ap.error(f"--near-miss-frac must be in [0, 1], got {a.near_miss_frac}")
    if a.policy and a.near_miss_frac:
        ap.error("--near-miss-frac swaps the scripted expert's steps; with --policy there are none")
    if a.policy and not a.collect:
        ap.error("--policy chooses the actions of --collect; give --collect FILE too")
    if a.compare:
        import stats
        import wm_eval

        for name, r in wm_eval.compare_predictions(*a.compare).items():
            print(stats.paired_line(name, r))
    if a.collect:
        seeds = webenv.eval_seeds(a.seeds) if a.eval_seeds else webenv.train_seeds(a.seeds, a.seed_offset)
        policy_fn = checkpoint_policy(a.policy, temperature=a.temperature) if a.policy else None
        print(collect_transitions(tasks, seeds, a.collect, policy_fn=policy_fn, random_frac=a.random_frac,
                                  near_miss_frac=a.near_miss_frac, max_steps=a.max_steps, progress=True))
    if a.eval:
        import wm_eval

        wm_eval.evaluate_checkpoint(a.eval, a.data, tasks, a.drift, a.out)
