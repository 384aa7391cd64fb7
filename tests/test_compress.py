"""Dynamic context compression with the real SmolLM2 tokenizer."""
import pytest

import compress
import policy


@pytest.fixture(scope="module")
def tok():
    return policy.load_tokenizer()


def obs(i, extra=""):
    return f"Goal: Click on the button {i}.\nURL: file:///m/miniwob/click-button.html\n[{10 + i}] button 'Button {i}'{extra}"


def history(n):
    return [{"observation": obs(i), "response": f"<think>step {i}</think>click('{10 + i}')"} for i in range(n)]


def test_old_observations_become_placeholders_and_every_reply_is_kept():
    msgs = compress.build_messages(history(3), obs(3), keep_last=2)
    users = [m["content"] for m in msgs if m["role"] == "user"]
    assert users[0] == users[1] == "[observation of click-button.html omitted]"
    assert users[2] == obs(2) and users[3] == obs(3)  # the last k=2 observations stay whole
    assert [m["content"] for m in msgs if m["role"] == "assistant"] == [t["response"] for t in history(3)]


def test_no_compress_keeps_every_observation():
    msgs = compress.build_messages(history(3), obs(3), compress=False)
    assert [m["content"] for m in msgs if m["role"] == "user"] == [obs(i) for i in range(4)]


def test_compressed_prompt_is_shorter_and_ends_with_generation_header(tok):
    long_obs = lambda i: obs(i, "\n" + "\n".join(f"[{100 + j}] link 'item {j}'" for j in range(30)))
    hist = [{"observation": long_obs(i), "response": f"click('{10 + i}')"} for i in range(6)]
    full = compress.build_prompt(tok, hist, long_obs(6), compress=False, max_tokens=10_000)
    short = compress.build_prompt(tok, hist, long_obs(6), max_tokens=10_000)
    assert len(short) * 3 < len(full)
    assert tok.decode(short).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("budget", [120, 200, 400])
def test_budget_is_never_exceeded_and_oldest_turns_go_first(tok, budget):
    long = "\n".join(f"[{100 + j}] link 'item number {j}'" for j in range(80))
    hist = [{"observation": obs(i, "\n" + long), "response": f"click('{10 + i}')"} for i in range(5)]
    for c in (True, False):
        ids = compress.build_prompt(tok, hist, obs(5, "\n" + long), compress=c, max_tokens=budget)
        assert len(ids) <= budget
        text = tok.decode(ids)
        assert "Goal: Click on the button 5." in text  # the current goal survives any cut
        if "click('10')" in text:  # if the oldest reply survived, every newer one did too
            assert all(f"click('{10 + i}')" in text for i in range(5))


def test_budget_below_system_prompt_raises(tok):
    with pytest.raises(ValueError, match="system prompt"):
        compress.build_prompt(tok, [], obs(0), max_tokens=10)


def test_turn_by_turn_prompt_is_a_prefix_of_the_whole_chat(tok):
    # Without compression, the prompt of turn t plus its reply is a prefix of turn t+1's prompt.
    hist = history(2)
    p1 = compress.build_prompt(tok, hist[:1], obs(1), compress=False)
    p2 = compress.build_prompt(tok, hist, obs(2), compress=False)
    reply = tok.encode(hist[1]["response"], add_special_tokens=False) + [tok.eos_token_id]
    assert p2[:len(p1) + len(reply)] == p1 + reply


def test_budget_drops_the_oldest_whole_turns_and_keeps_the_newest(tok):
    # Long past replies (kept verbatim, so only dropping turns saves room), a short current
    # observation, and a budget that holds exactly the newest three turns of eight.
    hist = [{"observation": obs(i), "response": f"<think>{'reasoning about the page ' * 8}</think>click('{10 + i}')"}
            for i in range(8)]
    kept = compress.render(tok, compress.build_messages(hist[5:], obs(8)))
    assert len(compress.render(tok, compress.build_messages(hist[4:], obs(8)))) > len(kept)  # a fourth turn does not fit
    for c in (True, False):
        ids = compress.build_prompt(tok, hist, obs(8), compress=c, max_tokens=len(kept))
        text = tok.decode(ids)
        assert [i for i in range(8) if f"click('{10 + i}')" in text] == [5, 6, 7], c
        assert obs(8) in text and ids == kept  # the current observation whole, older pages as placeholders
