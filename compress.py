"""Dynamic context compression (WebAgent-R1, Sec. 3.2): build the turn-t prompt.

A multi-turn episode is a chat: system, then for every past turn the observation (user) and
the agent's reply (assistant), then the current observation. Every past reply, thought and
action, is kept verbatim; observations older than the last `keep_last` are replaced by a short
placeholder that names the page. A token budget caps the prompt: when it is exceeded the
oldest turns shrink first (their observations become placeholders, then the oldest turns are
dropped whole), and as a last resort the current observation is cut. `compress=False` keeps
every observation (the ablation), still under the budget.

Page text and model text become token ids as the ordinary characters they are: an observation or a
past reply holding `<|im_end|><|im_start|>assistant` cannot forge a turn (render, encode_text). Text
without such strings is tokenised exactly as the chat template's own `apply_chat_template` does.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import axtree

# Short on purpose: about 97% of every training sequence is prompt, and this is in all of them.
SYSTEM_PROMPT = ("You are a web agent. Reply with one action: click('bid'), fill('bid', 'text'), "
                 "select_option('bid', 'option'), press('bid', 'Enter').")

THINK_SUFFIX = " First think briefly inside <think></think>, then give the action."
THINK_SYSTEM_PROMPT = SYSTEM_PROMPT + THINK_SUFFIX
# General sites (WebArena-Lite): the grammar's navigation, tab and keyboard actions too
# (actions.WEB_ACTIONS), and how an episode ends (env.ENDING_ACTIONS).
WEB_SYSTEM_PROMPT = ("You are a web agent. Reply with one action: click('bid'), fill('bid', 'text'), "
                     "select_option('bid', 'option'), press('bid', 'Enter'), hover('bid'), scroll(0, 300), "
                     "goto('url'), go_back(), go_forward(), new_tab(), tab_focus(1), tab_close(), "
                     "keyboard_press('Enter'), keyboard_type('text'). When the goal is done, reply "
                     "send_msg_to_user('answer') with the answer it asks for (else 'done'); if it cannot be "
                     "done, report_infeasible('why').")
SYSTEM_PROMPTS = {"miniwob": SYSTEM_PROMPT, "webarena-lite": WEB_SYSTEM_PROMPT}  # by benchmark

_URL = re.compile(r"^URL: *(\S+)", re.M)
HEADER = "Goal: \nURL: "  # an observation's first two lines, without their text
CUT_MARK = "\n[...cut]"     # ends an observation cut to fit the budget


def placeholder(observation: str) -> str:
    """The short stand-in for an old observation: it names the page (its file or path)."""
    m = _URL.search(observation)
    page = m.group(1).rstrip("/").rsplit("/", 1)[-1] if m else "page"
    return f"[observation of {page} omitted]"


def build_messages(history: list[dict], observation: str, *, keep_last: int = 1, compress: bool = True,
                   system: str = SYSTEM_PROMPT, drop_first: int = 0, shrink_first: int = 0) -> list[dict]:
    """Chat messages for the next reply.

    history: past turns, oldest first, each {"observation": str, "response": str}.
    observation: the current observation text (shown in full, as the last user message).
    keep_last: how many of the most recent observations stay in full, the current one included
        (1: only the current page; 2: the current and the previous one).
    drop_first: leave out the oldest `drop_first` turns entirely (the budget's last resort).
    shrink_first: replace the observations of the oldest `shrink_first` turns by placeholders
        even when compress=False (how the budget shrinks the uncompressed ablation).
    """
    msgs = [{"role": "system", "content": system}]
    n = len(history)
    for i, turn in enumerate(history):
        if i < drop_first:
            continue
        old = (n - i) >= keep_last  # the current observation counts as one of the last k
        obs = turn["observation"]
        if (compress and old) or i < shrink_first:
            obs = placeholder(obs)
        msgs.append({"role": "user", "content": obs})
        msgs.append({"role": "assistant", "content": turn["response"]})
    msgs.append({"role": "user", "content": observation})
    return msgs


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of untrusted text (page or model text) with no special tokens added: a string such as
    `<|im_end|>` inside it is encoded as the ordinary characters it is, never as a control id."""
    return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)


def encode_reply(tokenizer, text: str) -> list[int]:
    """Token ids of a reply as the model must produce it to end its turn: `encode_text(text)` (untrusted:
    an `<|im_end|>` written inside it stays ordinary characters) followed by the one end-of-turn id
    (tokenizer.eos_token_id). The target of every teacher-forced term: BC, the world model's Δ, the
    judge's verdict, and the scoring of recorded replies."""
    return encode_text(tokenizer, text) + [tokenizer.eos_token_id]


def _template_ids(tokenizer, messages: list[dict]) -> list[int]:
    enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(enc["input_ids"] if hasattr(enc, "keys") else enc)


@lru_cache(maxsize=8)
def _specials(tokenizer) -> tuple[dict[str, int], re.Pattern | None]:
    """The tokenizer's special tokens (text -> id) and a pattern that finds them, longest first (None
    when it has none)."""
    tokens = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    tokens |= {t for t in tokenizer.all_special_tokens if t}
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in tokens}
    return ids, re.compile("|".join(map(re.escape, sorted(ids, key=len, reverse=True)))) if ids else None


def render_untrusted(tokenizer, messages: list[dict]) -> list[int]:
    """render's route for contents that hold special-token strings. Each such string in a content is
    hidden behind a private-use character absent from every content, the template renders the chat
    as text (its own rewriting of contents, such as trimming, applies), the text is cut at the special
    tokens that remain, which are the template's own, and each piece between them is encoded with
    encode_text, hidden strings restored. On text without special strings the result equals
    apply_chat_template's for tokenizers that encode the pieces between special tokens independently
    (byte-level BPE: SmolLM2, Qwen, Llama 3; tests/test_compress.py checks it on real observations)."""
    ids, pattern = _specials(tokenizer)
    if pattern is None:
        return _template_ids(tokenizer, messages)
    used = {c for m in messages for c in str(m.get("content", ""))}
    free = (chr(c) for c in range(0xF0000, 0xFFFFE) if chr(c) not in used)
    hide = {t: next(free) for t in ids}
    show = {c: t for t, c in hide.items()}
    hidden = [dict(m, content=pattern.sub(lambda x: hide[x.group()], str(m["content"]))) for m in messages]
    text = tokenizer.apply_chat_template(hidden, add_generation_prompt=True, tokenize=False)
    out, at = [], 0
    restore = re.compile("|".join(map(re.escape, show)))
    for m in list(pattern.finditer(text)) + [None]:
        piece = text[at:m.start() if m else len(text)]
        if piece:
            out += encode_text(tokenizer, restore.sub(lambda x: show[x.group()], piece))
        if m:
            out.append(ids[m.group()])
            at = m.end()
    return out


def render(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of the chat, ending with the assistant header (ready for generation). Contents are
    untrusted (page text, model replies): a special-token string inside one is encoded as ordinary
    characters (render_untrusted); the ids of control tokens are exactly the template's own. Contents
    without such strings: apply_chat_template's own ids."""
    _, pattern = _specials(tokenizer)
    if pattern is not None and any(pattern.search(str(m.get("content", ""))) for m in messages):
        return render_untrusted(tokenizer, messages)
    return _template_ids(tokenizer, messages)


def min_tokens(tokenizer, system: str = SYSTEM_PROMPT) -> int:
    """The smallest workable prompt budget: the system prompt and an observation's header (`Goal:`,
    `URL:`, empty) with the mark of a cut observation. build_prompt refuses a smaller one; train.py and
    eval.py refuse --max-prompt-tokens below it."""
    return len(render(tokenizer, build_messages([], HEADER + CUT_MARK, system=system)))


def build_prompt(tokenizer, history: list[dict], observation: str, *, keep_last: int = 1,
                 compress: bool = True, max_tokens: int = 1024, system: str = SYSTEM_PROMPT) -> list[int]:
    """Prompt ids for the next reply, never longer than `max_tokens`.

    Shrinks in this order until it fits: oldest kept observations become placeholders, oldest
    turns are dropped, then the current observation is cut from its end (the goal and URL lead
    it, so they survive). Raises ValueError if max_tokens < min_tokens(tokenizer, system): the
    system prompt and the observation's header would not fit.
    """
    least = min_tokens(tokenizer, system)
    if max_tokens < least:
        raise ValueError(f"max_tokens={max_tokens} cannot hold the system prompt and an observation's header: "
                         f"the smallest workable budget is {least} tokens")
    n = len(history)
    for shrink in range(0, n + 1):  # only matters when compress=False or keep_last > 1
        ids = render(tokenizer, build_messages(history, observation, keep_last=keep_last, compress=compress,
                                               system=system, shrink_first=shrink))
        if len(ids) <= max_tokens:
            return ids
    for drop in range(1, n + 1):
        ids = render(tokenizer, build_messages(history, observation, keep_last=keep_last, compress=compress,
                                               system=system, drop_first=drop, shrink_first=n))
        if len(ids) <= max_tokens:
            return ids
    # Only the current observation is left and it is still too long: cut its text.
    base = len(render(tokenizer, build_messages([], "", system=system)))
    obs_ids = encode_text(tokenizer, observation)
    keep = max_tokens - base
    while keep > 0:
        text = tokenizer.decode(obs_ids[:keep]) + CUT_MARK
        ids = render(tokenizer, build_messages([], text, system=system))
        if len(ids) <= max_tokens:
            return ids
        keep -= max(1, len(ids) - max_tokens)
    return render(tokenizer, build_messages([], "", system=system))


# An accessibility-tree line as axtree.py writes it: indentation, [bid], the role (everything up to the
# next space, as axtree.parse_line reads it), then the quoted name when the node has one, then the rest.
_TREE_LINE = re.compile(rf"^( *)\[({axtree.BID})\] (\S+)( (?:{axtree.STRING}))?", re.M)


def bid_after_name(observation: str) -> str:
    """The observation with each tree line's bid moved after the element's role and name:
    `[28] button 'OK', focused` becomes `button 'OK' [28], focused`; other lines (goal, URL, errors)
    are unchanged. Why: a thought names the element, then its bid (`Click the button 'OK' [28]`), and
    with the bid after the name that bid is the token that follows the same words in the tree, which
    a small model copies far more reliably than the token before them (docs/rl.md measured it)."""
    return _TREE_LINE.sub(lambda m: f"{m[1]}{m[3]}{m[4] or ''} [{m[2]}]", observation)


@dataclass(frozen=True)
class PromptSettings:
    """How every turn's prompt is built: the same at rollout, in BC targets' prompts and at eval
    (train.py stores them with each checkpoint, in webdream.json, for eval.py)."""
    keep_last: int = 1        # observations kept in full, the current one included
    compress: bool = True     # False: the ablation that keeps every observation (still under the budget)
    max_tokens: int = 1024    # the prompt's token budget
    think: bool = False       # ask for a <think> block before the action (THINK_SYSTEM_PROMPT)
    benchmark: str = "miniwob"  # whose system prompt (SYSTEM_PROMPTS): the actions it lists
    bid_last: bool = False    # tree lines show the bid after the element's role and name (bid_after_name; train.py
                              # and eval.py default to it: checkpoint.PROMPT_DEFAULTS)

    @property
    def system(self) -> str:
        """The system prompt: the benchmark's, with THINK_SUFFIX when thinking."""
        return SYSTEM_PROMPTS[self.benchmark] + (THINK_SUFFIX if self.think else "")

    def build(self, tokenizer, history: list[dict], observation: str) -> list[int]:
        """build_prompt with these settings."""
        if self.bid_last:
            history = [dict(h, observation=bid_after_name(h["observation"])) for h in history]
            observation = bid_after_name(observation)
        return build_prompt(tokenizer, history, observation, keep_last=self.keep_last, compress=self.compress,
                            max_tokens=self.max_tokens, system=self.system)
