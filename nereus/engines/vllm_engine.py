"""vLLM behind the generation-engine interface, for GPU clusters (effectful).

Written against vLLM's public offline API of the V1 engine, **vLLM 0.10.2 – 0.11.x** (the
releases with ``LLM.apply_model`` and ``logprobs_mode``); it cannot run on the CPU-only
development machines, so it is exercised only against a test double there
(``tests/pure/test_vllm_engine.py``, labelled MOCK) — the calls below are what that double checks,
not behaviour observed on a GPU.

- **Engine**: one ``vllm.LLM`` per rank of an actor-gen unit, SPMD like the rest of the
  runtime: ``distributed_executor_backend="external_launcher"`` (every rank of the unit builds
  its engine and runs the same requests; vLLM then disables its V1 multiprocessing so the model
  lives in this process), ``tensor_parallel_size`` = the unit's tp. The model directory holds
  only a generated Hugging Face ``config.json`` (:func:`nereus.emu.hf_layout.hf_config`);
  ``load_format="dummy"`` leaves the weights to :meth:`VllmEngine.refresh_weights`, and
  ``skip_tokenizer_init=True`` because prompts are token ids (``{"prompt_token_ids": [...]}``,
  each prompt without its left padding: vLLM batches sequences of any length itself).
  ``logprobs_mode="processed_logprobs"`` makes the returned log-probs those of the
  temperature-scaled distribution that was sampled, as the Megatron engine's are;
  ``generation_config="vllm"`` keeps vLLM's neutral sampling defaults; prefix caching is off.
- **Placement** (:func:`check_vllm_placement`): vLLM's external launcher forms its tensor-parallel
  groups from consecutive ranks of the whole ``torch.distributed`` world, and every rank of the
  world joins their creation. So actor-gen's replicas must be exactly the aligned blocks
  ``[k·tp, (k+1)·tp)`` covering the world, at pp = 1 — checked on every rank before any engine
  is built, one line otherwise.
- **Sampling**: one ``SamplingParams`` per row — ``temperature``, ``max_tokens``,
  ``logprobs=0`` (the sampled token's own log-prob), ``stop_token_ids`` the request's EOS ids,
  ``seed=request_seed(seed, step, global sample index)`` — so a row's sample does not depend on
  which replica or batch it ran in; greedy (ReMax's baseline) is ``temperature=0``.
- **Weights**: after every weight sync the runtime's EMU transfer has written actor-train's
  parameters into the actor-gen unit; :meth:`VllmEngine.refresh_weights` reads that unit's
  global logical state (a callable the runtime supplies: an all-gather over the unit's tp group),
  converts it to Hugging Face names and tensors and hands them to the in-process model's
  ``load_weights`` through ``LLM.apply_model`` — the path verl's Megatron → vLLM sharding manager
  takes (``llm_engine.model_executor.driver_worker.worker.model_runner.model.load_weights`` in its
  vLLM 0.8–0.9 era); vLLM's loaders shard each full tensor to their tp rank themselves.
- **Outputs**: ``RequestOutput.outputs[0].token_ids`` (EOS included when it stopped there) become
  ``Generated``: prompt then response padded with PAD, the sampled tokens' log-probs, a mask of 1
  on response tokens.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nereus.emu.hf_layout import hf_config, hf_tensors
from nereus.errors import ConfigError, NereusError
from nereus.rl.task import EOS, PAD
from nereus.spec.model import ModelSpec
from nereus.spec.plan import StagePlan

if TYPE_CHECKING:
    from nereus.engines.backend import GenRequest
    from nereus.engines.generation import Generated

SUPPORTED_VLLM = "0.10.2 – 0.11.x"
BOS = EOS  # the task vocabulary has no BOS; prompts are complete token ids


class VllmUnavailable(NereusError):
    """vLLM cannot be used on this machine (not installed, or no CUDA device)."""


class EnginePlacementError(NereusError):
    """The plan places actor-gen where the vLLM engine cannot run it."""


def vllm_unavailable_reason() -> str | None:
    """Why vLLM cannot run here (one phrase), or None. Imports neither vLLM nor, when vLLM is
    missing, torch."""
    if "vllm" not in sys.modules and importlib.util.find_spec("vllm") is None:
        return "the vllm package is not installed (pip install vllm on a CUDA machine)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch (vLLM's engine here needs NVIDIA GPUs)"
    return None


def require_vllm(generation: str) -> None:
    """``runtime.generation: vllm`` needs vLLM and a CUDA device here: ConfigError otherwise
    (checked before any rank starts, and again on every rank)."""
    if generation != "vllm":
        return
    reason = vllm_unavailable_reason()
    if reason is not None:
        raise ConfigError("runtime.generation", generation,
                          f"needs vLLM on CUDA GPUs, but {reason}")


def check_vllm_placement(plan: StagePlan, world_size: int) -> None:
    """Raise :class:`EnginePlacementError` unless vLLM's external launcher can serve ``plan``
    (actor-gen at pp = 1, its replicas exactly the aligned tp blocks of the world). Pure."""
    if plan.pp != 1:
        raise EnginePlacementError(
            f"runtime.generation=vllm: {plan.name} runs at pp={plan.pp}; the vLLM engine takes "
            "pp=1 (tensor parallel only)")
    tp = plan.tp
    blocks = sorted(tuple(sorted(r)) for r in plan.replicas)
    want = [tuple(range(k * tp, (k + 1) * tp)) for k in range(world_size // tp)]
    if world_size % tp or blocks != want:
        raise EnginePlacementError(
            f"runtime.generation=vllm: {plan.name}'s replicas {blocks} must be the {world_size} "
            f"ranks in aligned blocks of tp={tp} (vLLM's external launcher forms its tp groups "
            "from consecutive ranks of the whole world)")


def request_seed(seed: int, step: int, sample_id: int) -> int:
    """A 63-bit seed for global sample ``sample_id`` at ``step`` (layout-free, deterministic):
    vLLM's per-request ``SamplingParams.seed``."""
    words = np.random.SeedSequence([seed, step, int(sample_id), 11]).generate_state(2, np.uint32)
    return int((int(words[0]) << 31) ^ int(words[1]))


def vllm_dtype(dtype_bytes: int) -> str:
    return {2: "bfloat16", 4: "float32"}.get(dtype_bytes, "auto")


def outputs_to_generated(prompts: Any, outputs: Sequence[Any], max_new: int,
                         kv_bytes: int, eos_ids: Sequence[int] = (EOS,),
                         pad_id: int = PAD) -> Generated:
    """vLLM ``RequestOutput``s (one per prompt row, in order) → ``Generated`` (the prompts as
    given, padding included; each response cut after its first EOS, then ``pad_id``)."""
    import torch

    from nereus.engines.generation import Generated

    b = prompts.shape[0]
    if len(outputs) != b:
        raise NereusError(f"vLLM returned {len(outputs)} outputs for {b} prompts")
    tokens = torch.full((b, max_new), pad_id, dtype=torch.long)
    logp = torch.zeros(b, max_new, dtype=torch.float64)
    mask = torch.zeros(b, max_new, dtype=torch.float64)
    for i, out in enumerate(outputs):
        comp = out.outputs[0]
        ids = list(comp.token_ids)
        if len(ids) > max_new:
            raise NereusError(f"vLLM returned {len(ids)} tokens for max_tokens={max_new}")
        stop = next((j for j, tok in enumerate(ids) if tok in eos_ids), None)
        if stop is not None:  # nothing after the first EOS counts (the mask covers EOS itself)
            ids = ids[:stop + 1]
        lps = comp.logprobs or []
        if len(lps) < len(ids):
            raise NereusError(f"vLLM returned log-probs for {len(lps)} of {len(ids)} tokens")
        n = len(ids)
        tokens[i, :n] = torch.tensor(ids, dtype=torch.long)
        logp[i, :n] = torch.tensor([float(lps[t][tok].logprob) for t, tok in enumerate(ids)],
                                   dtype=torch.float64)
        mask[i, :n] = 1.0
    return Generated(torch.cat([prompts.long(), tokens], dim=1), logp, mask, kv_bytes)


class VllmEngine:
    """vLLM generation for one rank of an actor-gen unit (see the module docstring)."""

    name = "vllm"

    def __init__(self, spec: ModelSpec, *, tp: int, params: Callable[[], Mapping[str, Any]],
                 max_model_len: int, seed: int, rank: int, local_rank: int,
                 dtype: str = "bfloat16", gpu_memory_utilization: float = 0.5) -> None:
        """``params`` returns the unit's global logical parameters (Megatron names) each time
        the weights are refreshed; ``rank``/``local_rank`` are this process's torch.distributed
        rank and its GPU on the node (vLLM's external launcher reads them as RANK/LOCAL_RANK)."""
        reason = vllm_unavailable_reason()
        if reason is not None:
            raise VllmUnavailable(f"runtime.generation=vllm: {reason}")
        import vllm

        self.spec = spec
        self.tp = tp
        self._params = params
        self._dtype_bytes = 4 if dtype == "float32" else 2
        self._dir = tempfile.mkdtemp(prefix="nereus-vllm-")
        config = hf_config(spec, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=BOS,
                           torch_dtype=dtype, max_position_embeddings=max(max_model_len,
                                                                          spec.max_seq_len))
        with open(os.path.join(self._dir, "config.json"), "w") as fh:
            json.dump(config, fh, indent=1)
        os.environ["RANK"] = str(rank)
        os.environ["LOCAL_RANK"] = str(local_rank)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=self._dir,
            skip_tokenizer_init=True,
            load_format="dummy",
            tensor_parallel_size=tp,
            distributed_executor_backend="external_launcher",
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=False,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
        )

    def sampling_params(self, req: GenRequest) -> list[Any]:
        """One ``SamplingParams`` per row of ``req`` (seeded by its global sample index)."""
        sp = self._vllm.SamplingParams
        temperature = 0.0 if req.greedy else req.temperature
        return [sp(n=1, temperature=temperature, max_tokens=req.max_new_tokens, logprobs=0,
                   stop_token_ids=list(req.eos_ids),
                   seed=request_seed(req.seed, req.step, int(i)),
                   detokenize=False)
                for i in req.sample_ids]

    def generate(self, req: GenRequest) -> Generated:
        prompts = [{"prompt_token_ids": row} for row in req.unpadded()]  # no padding: no mask
        outputs = self.llm.generate(prompts, sampling_params=self.sampling_params(req),
                                    use_tqdm=False)
        return outputs_to_generated(req.prompts, outputs, req.max_new_tokens,
                                    self.kv_cache_bytes(), req.eos_ids, req.pad_id)

    def refresh_weights(self) -> int:
        """Load the unit's current weights into vLLM's model; returns the bytes handed over."""
        import torch

        params = self._params()
        spec = self.spec
        moved = [0]

        def load(model: Any) -> Any:
            def named() -> Any:
                for name, arr in hf_tensors(spec, params):
                    t = torch.from_numpy(np.ascontiguousarray(arr))
                    moved[0] += t.numel() * t.element_size()
                    yield name, t
            return model.load_weights(named())

        loaded = self.llm.apply_model(load)
        if not loaded or not all(loaded):
            raise NereusError("vLLM's load_weights loaded no parameters")
        return moved[0]

    def kv_cache_bytes(self) -> int:
        """The KV cache vLLM preallocated on this rank: blocks × block size × per-token bytes."""
        cache = self.llm.llm_engine.vllm_config.cache_config
        blocks = int(cache.num_gpu_blocks or 0)
        kv_heads = max(1, self.spec.num_kv_heads // self.tp)
        per_token = 2 * self.spec.num_layers * kv_heads * self.spec.kv_channels * self._dtype_bytes
        return blocks * int(cache.block_size) * per_token

    def close(self) -> None:
        """Drop the engine and its generated config directory."""
        self.llm = None
        shutil.rmtree(self._dir, ignore_errors=True)
