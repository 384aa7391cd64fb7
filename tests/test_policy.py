"""Sampling and scoring with the real tokenizer and a tiny real model built from a config."""
import torch

import policy


def test_sampled_logprobs_equal_recomputed_logprobs(tok, model, prompts):
    torch.manual_seed(0)
    ps = prompts
    samples = policy.generate(model, tok, ps, max_new_tokens=12, temperature=1.0)
    ids, mask, rm, L = policy.response_batch(ps, [s.ids for s in samples], tok.pad_token_id)
    with torch.no_grad():
        lp = policy.token_logprobs(model, ids, mask, L)
    for j, s in enumerate(samples):
        assert len(s.ids) == len(s.logprobs) >= 1
        got = lp[j, L - len(s.ids):]
        assert torch.allclose(got, torch.tensor(s.logprobs), atol=1e-4)
        assert rm[j].sum() == len(s.ids)


def test_padding_does_not_change_logprobs(tok, model, prompts):
    ps = prompts
    r = [tok.encode("click('3')", add_special_tokens=False) + [tok.eos_token_id]] * 2
    ids, mask, _, L = policy.response_batch(ps, r, tok.pad_token_id)
    with torch.no_grad():
        both = policy.token_logprobs(model, ids, mask, L)
        for j in range(2):
            i1, m1, _, _ = policy.response_batch([ps[j]], [r[j]], tok.pad_token_id)
            alone = policy.token_logprobs(model, i1, m1, L)
            assert torch.allclose(both[j], alone[0], atol=1e-5)


def test_generation_stops_at_end_of_turn(tok, model, prompts):
    # Force the model to end at once: make <|im_end|> overwhelmingly likely.
    m = policy.tiny_model(tok, seed=1)
    with torch.no_grad():
        m.lm_head.weight.zero_() if not m.config.tie_word_embeddings else None
        m.model.norm.weight.fill_(1.0)
        bias = torch.zeros(len(tok)); bias[tok.eos_token_id] = 50.0
        m.lm_head.register_forward_hook(lambda mod, i, o: o + bias)
    s = policy.generate(m, tok, prompts, max_new_tokens=8, temperature=1.0)
    for x in s:
        assert x.ids == [tok.eos_token_id] and x.text == "" and not x.truncated


def test_length_limit_marks_truncated(tok, model, prompts):
    with torch.no_grad():
        bias = torch.zeros(len(tok)); bias[tok.eos_token_id] = -1e4
    h = model.lm_head.register_forward_hook(lambda mod, i, o: o + bias)
    try:
        s = policy.generate(model, tok, prompts, max_new_tokens=5, temperature=1.0)
    finally:
        h.remove()
    assert all(len(x.ids) == 5 and x.truncated for x in s)


def test_response_mask_comes_from_lengths_not_pad_ids(tok):
    # the reply ends with <|im_end|>, which is also the pad id: it must stay in the mask
    eos = tok.eos_token_id
    assert tok.pad_token_id == eos
    ids, mask, rm, L = policy.response_batch([[1, 5, 6], [1, 5]], [[9, eos], [eos]], tok.pad_token_id)
    assert L == 2 and rm.tolist() == [[1.0, 1.0], [0.0, 1.0]]
    assert ids[1].tolist() == [eos, eos, 1, 5, eos] and mask[1].tolist() == [0, 0, 1, 1, 1]


def test_shared_prefill_gives_the_same_replies_and_logprobs_as_separate_prefills(tok, model, prompts):
    # a group's first turn: G identical prompts, beside other prompts, at temperature 1 and greedy
    ps = [prompts[0]] * 4 + [prompts[1]] * 3 + [prompts[0] + prompts[1][-5:]]
    rows = []  # the batch size of every forward pass
    hook = model.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True)
    try:
        for temperature in (1.0, 0.0):
            torch.manual_seed(7)
            rows.clear()
            shared = policy.generate(model, tok, ps, max_new_tokens=10, temperature=temperature, share_prefill=True)
            # the common prefix once, then one row per distinct prompt, then 8 decoding rows
            assert rows[:2] == [1, 3] and all(r == len(ps) for r in rows[2:])
            torch.manual_seed(7)
            rows.clear()
            alone = policy.generate(model, tok, ps, max_new_tokens=10, temperature=temperature, share_prefill=False)
            assert rows[0] == len(ps)
            for a, b in zip(shared, alone):  # the same draws from the same distribution
                assert a.ids == b.ids and a.truncated == b.truncated
                assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
                assert abs(a.entropy - b.entropy) < 1e-5
    finally:
        hook.remove()
    # and the shared replies' log-probs are what scoring recomputes: softmax(logits / T) itself
    torch.manual_seed(3)
    samples = policy.generate(model, tok, ps, max_new_tokens=10, temperature=0.7)
    ids, mask, _, L = policy.response_batch(ps, [s.ids for s in samples], tok.pad_token_id)
    with torch.no_grad():
        lp = policy.token_logprobs(model, ids, mask, L, temperature=0.7)
    for j, s in enumerate(samples):
        assert torch.allclose(lp[j, L - len(s.ids):], torch.tensor(s.logprobs), atol=1e-5)


def test_preallocated_kv_cache_gives_the_same_replies_and_logprobs(tok, model, prompts):
    # generate writes each new token into a KV cache allocated once (policy._preallocate) instead of
    # growing it by torch.cat: a group's shared prefill, other prompts beside it, sampled and greedy
    ps = [prompts[0]] * 3 + [prompts[1]] * 2 + [prompts[0] + prompts[1][-5:]]
    for temperature in (1.0, 0.0):
        out = []
        for preallocate in (True, False):
            torch.manual_seed(11)
            out.append(policy.generate(model, tok, ps, max_new_tokens=12, temperature=temperature,
                                       preallocate=preallocate))
        for a, b in zip(*out):
            assert a.ids == b.ids and a.truncated == b.truncated
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-6)
    # the layer itself: in-place writes, growth past its room, and batch reindexing, against torch.cat
    from transformers.cache_utils import DynamicCache

    torch.manual_seed(0)
    k0, v0 = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    ref, pre = DynamicCache(), DynamicCache()
    for c in (ref, pre):
        c.update(k0.clone(), v0.clone(), 0)
    policy._preallocate(pre, 2)
    assert type(pre.layers[0]).__name__ == "PreallocatedLayer"
    for step in range(4):  # the third write finds the buffers full and grows them
        k, v = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
        if step == 1:
            for c in (ref, pre):
                c.batch_select_indices(torch.tensor([1, 1, 0]))
            k, v = torch.randn(3, 3, 1, 4), torch.randn(3, 3, 1, 4)
        if step > 1:
            k, v = torch.randn(3, 3, 1, 4), torch.randn(3, 3, 1, 4)
        a, b = ref.update(k, v, 0), pre.update(k, v, 0)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), step


def test_identical_prompts_sample_independently(tok, model, prompts):
    # copies of one prompt share a prefill, not their draws: 16 samples of 8 tokens are not all equal
    torch.manual_seed(0)
    samples = policy.generate(model, tok, [prompts[0]] * 16, max_new_tokens=8, temperature=1.0)
    assert len({tuple(s.ids) for s in samples}) > 8


def test_shared_prefix_scoring_equals_whole_rows_in_values_and_gradients(tok, prompts):
    # a group's first turn (identical prompts) beside prompts that share only the system prompt
    import compress

    other = compress.build_prompt(tok, [], "Goal: pick Blue\nURL: c.html\n[9] combobox 'colour'\n[10] option 'Blue'")
    ps = [prompts[0]] * 3 + [prompts[1], other]
    rs = [tok.encode(a, add_special_tokens=False) + [tok.eos_token_id]
          for a in ["click('3')", "click('4')", "<think>x</think>click('3')", "fill('7', 'hello')", "click('10')"]]
    assert policy.common_prefix_len(ps) >= policy.MIN_SHARED_PREFIX  # the system prompt, at least
    results = {}
    for share in (False, True):
        model = policy.tiny_model(tok)
        rows = []
        hook = model.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape), with_kwargs=True)
        lp, rm, L = policy.reply_logprobs(model, ps, rs, tok.pad_token_id, temperature=0.8, share_prefix=share)
        hook.remove()
        (lp * rm).sum().backward()
        results[share] = (lp.detach(), rm, {n: p.grad.clone() for n, p in model.named_parameters()}, rows)
    (a, ra, ga, rows_a), (b, rb, gb, rows_b) = results[False], results[True]
    assert torch.equal(ra, rb) and torch.allclose(a * ra, b * rb, atol=1e-5)
    assert all(torch.allclose(ga[n], gb[n], atol=1e-5, rtol=1e-4) for n in ga)
    assert len(rows_a) == 1 and len(rows_b) == 2  # the prefix once (one row), then the five rows' own parts
    assert rows_b[0][0] == 1 and rows_b[1][1] < rows_a[0][1]
    # the plain scorer agrees: these are the reply tokens' log-probs at temperature 0.8
    ids, mask, rm2, L = policy.response_batch(ps, rs, tok.pad_token_id)
    with torch.no_grad():
        want = policy.token_logprobs(policy.tiny_model(tok), ids, mask, L, temperature=0.8)
    assert torch.allclose(want * rm2, b * rb, atol=1e-5)


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path):
    """The flags train.py warns by: avx512_bf16 or amx_bf16 among the words of /proc/cpuinfo; None without the file."""
    f = tmp_path / "cpuinfo"
    f.write_text("processor : 0\nflags : fpu avx avx2 avx512f avx512bw\n")
    assert policy.cpu_has_native_bf16(str(f)) is False
    f.write_text("processor : 0\nflags : fpu avx2 avx512f avx512_bf16\n")
    assert policy.cpu_has_native_bf16(str(f)) is True
    f.write_text("flags : fpu avx2 amx_bf16 amx_tile\n")
    assert policy.cpu_has_native_bf16(str(f)) is True
    assert policy.cpu_has_native_bf16(str(tmp_path / "absent")) is None
