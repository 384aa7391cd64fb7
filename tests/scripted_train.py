"""train.py with a scripted generator in place of the policy's sampling, so that RL runs earn rewards
that vary within groups (a random tiny model never succeeds, and a group of failures trains nothing).

    python tests/scripted_train.py alternate|random <train.py arguments>
    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/scripted_train.py alternate --mode real ...

The generator reads the observation that ends each prompt (the tokenizer decodes it) and answers
with the expert's action for it (experts.expert_action) or with a wrong one. Which, is decided at an
episode's first turn and kept: a later turn follows the expert unless an earlier reply was wrong.
- alternate: the episodes that start from the same prompt alternate, expert first, then wrong
  (noop()), and so on: with an even group size exactly half of each group succeeds.
- random: torch's global RNG decides: the expert with probability 1/2, otherwise one of three
  wrong replies, so what a run trains on depends on its RNG state (a resumed run must restore it).
ScriptedReplies is the base of any generator whose reply is a function of its prompt. Run as a
script, the repository root must be importable (PYTHONPATH); in a test, monkeypatch
generators.make_generator with make_generator(script) and call train.main.
"""
import random
import re
import sys
from collections import Counter

import torch

import axtree
import env
import experts
import generators
import policy
import train

WRONG = ["noop()", "scroll(0, 200)", "I am not sure."]  # none can solve a task
_TURN = re.compile(r"<\|im_start\|>(user|assistant)\n(.*?)<\|im_end\|>", re.S)
_OBS = re.compile(r"Goal: (.*?)\nURL: (\S*)\n(.*?)(?:\nLast action error: (.*))?\Z", re.S)


# a tree line of a --bid-last prompt (compress.bid_after_name): role, quoted name if any, [bid], the rest
_BID_LAST = re.compile(rf"^( *)(\S+)( (?:{axtree.STRING}))? \[({axtree.BID})\]", re.M)


def observation(text: str) -> env.Obs:
    """The env.Obs whose text (Obs.render) is `text`, read back from a prompt with the bids first or
    last (--bid-last: each tree line's bid is moved back before its role)."""
    m = _OBS.match(text)
    tree = m[3] if m[3].lstrip().startswith("[") else _BID_LAST.sub(lambda b: f"{b[1]}[{b[4]}] {b[2]}{b[3] or ''}", m[3])
    return env.Obs(goal=m[1], url=m[2], axtree=tree, error=m[4] or "")


class ScriptedReplies:
    """A generator with generators.py's contract whose reply to a prompt is `self.reply(prompt ids)`: the
    text's token ids and the end-of-turn id, log-probs 0: not pi_old's own (no logprobs_are_pi_old), so
    train.py scores pi_old from the ids.
    push_weights does nothing: the weights are never read."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def reply(self, prompt: list[int]) -> str:
        raise NotImplementedError

    def generate(self, prompts, *, max_new_tokens=32, temperature=1.0, batch_size=None):
        out = []
        for p in prompts:
            text = self.reply(p)
            ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
            out.append(policy.Sample(ids=ids, logprobs=[0.0] * len(ids), text=text))
        return out

    def push_weights(self, model):
        pass


class ScriptedGenerator(ScriptedReplies):
    """The expert or a wrong reply, as the module docstring says (script: alternate or random)."""

    def __init__(self, tokenizer, script: str):
        assert script in ("alternate", "random"), script
        super().__init__(tokenizer)
        self.script, self.starts = script, Counter()

    def reply(self, prompt: list[int]) -> str:
        turns = _TURN.findall(self.tok.decode(prompt))
        obs = observation(turns[-1][1])
        past = [text for role, text in turns if role == "assistant"]
        if past:
            expert = not any(text in WRONG for text in past)
        elif self.script == "alternate":
            expert = self.starts[tuple(prompt)] % 2 == 0
            self.starts[tuple(prompt)] += 1
        else:
            expert = bool(torch.rand(()) < 0.5)
            if not expert:
                return WRONG[int(torch.randint(len(WRONG), ()))]
        if not expert:
            return WRONG[0]
        task = obs.url.rsplit("/", 1)[-1].removesuffix(".html")
        return experts.expert_action(task, obs, random.Random(0))


def make_generator(script: str):
    """A stand-in for generators.make_generator that returns a ScriptedGenerator."""
    return lambda kind, model, tokenizer, **kw: ScriptedGenerator(tokenizer, script)


def main(argv):
    script, argv = argv[0], argv[1:]
    generators.make_generator = make_generator(script)
    train.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
    import gc

    gc.collect()  # as train.py does: collect the sharded model's cycles before interpreter finalization
