"""Generators: what rollout.py samples replies with, on the trainer's own weights or in vLLM.

    gen = make_generator("hf", model, tokenizer)          # or "vllm" on a CUDA machine
    samples = gen.generate(prompt_ids_list, max_new_tokens=32, temperature=1.0)   # [policy.Sample]
    gen.push_weights(model)                               # after every optimizer update

A generator samples replies for a batch of prompt ids with the contract of policy.generate (a list
of Sample; temperature 0 is greedy; a reply ends at the first of policy.stop_ids), and
`push_weights(model)` is called after every optimizer update so that the next rollout samples from
the updated policy.
"""
from __future__ import annotations

import os

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
            base = distributed.unwrap(model_path_or_model)
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
                                  truncated=not ids or ids[-1] not in self.stops))
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
