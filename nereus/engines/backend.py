"""The generation-engine interface and its Megatron-core implementation (effectful).

A :class:`GenerationEngine` samples responses for a batch of prompt token ids with a KV cache
and returns :class:`~nereus.engines.generation.Generated` (tokens with PAD after EOS, sampled
log-probs, response mask). Randomness is keyed by the *global sample index* of every row
(:class:`GenRequest`), never by the replica or rank that runs it, so the same seed gives the
same samples under any DP/TP layout. Two implementations:

- :class:`MegatronEngine` (CPU, and any device Megatron runs on): Megatron-core's static
  inference path over the unit's own GPTModel stage (:func:`nereus.engines.generation.generate`),
  inverse-CDF sampling from per-sample uniforms (:func:`sample_uniforms`). It generates with the
  unit's parameters themselves, which the EMU weight sync (actor-train → actor-gen) overwrites
  in place, so :meth:`refresh_weights` has nothing to move.
- :class:`nereus.engines.vllm_engine.VllmEngine` (GPU clusters): vLLM with a per-request seed
  derived by :func:`nereus.engines.vllm_engine.request_seed`; :meth:`refresh_weights` pushes the synced weights into vLLM's
  model in Hugging Face layout (:mod:`nereus.emu.hf_layout`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
import torch.distributed as dist

from nereus.engines.generation import Generated, generate, sample_uniforms
from nereus.engines.pipeline import StageLink
from nereus.rl.task import EOS, PAD

MEGATRON = "megatron"
VLLM = "vllm"
ENGINES = (MEGATRON, VLLM)


@dataclass(frozen=True)
class GenRequest:
    """One batch to generate: ``prompts`` [b, P] token ids, left-padded with ``pad_id`` where
    ``prompt_valid`` [b, P] is False (None: no padding; the padding is masked out of attention:
    a row samples what it samples alone), ``sample_ids`` [b] the rows' global sample indices,
    ``step`` the RL step; ``greedy`` picks the argmax (ReMax's baseline); a row stops at the
    first of ``eos_ids`` it samples."""

    prompts: torch.Tensor
    sample_ids: np.ndarray
    seed: int
    step: int
    max_new_tokens: int
    temperature: float = 1.0
    greedy: bool = False
    prompt_valid: torch.Tensor | None = None
    eos_ids: tuple[int, ...] = (EOS,)
    pad_id: int = PAD

    def __post_init__(self) -> None:
        if self.prompts.ndim != 2 or len(self.sample_ids) != self.prompts.shape[0]:
            raise ValueError(f"prompts {tuple(self.prompts.shape)} and {len(self.sample_ids)} "
                             "sample ids do not match")
        if self.prompt_valid is not None and self.prompt_valid.shape != self.prompts.shape:
            raise ValueError(f"prompt_valid {tuple(self.prompt_valid.shape)} does not match the "
                             f"prompts {tuple(self.prompts.shape)}")
        if not self.eos_ids:
            raise ValueError("a generation needs at least one EOS id")

    def unpadded(self) -> list[list[int]]:
        """Each prompt's real tokens (its padding dropped), as an engine without masks takes
        them (vLLM)."""
        rows = self.prompts.tolist()
        if self.prompt_valid is None:
            return [[int(t) for t in r] for r in rows]
        keep = self.prompt_valid.bool().tolist()
        return [[int(t) for t, k in zip(r, ks, strict=True) if k] for r, ks in zip(rows, keep,
                                                                                   strict=True)]


@runtime_checkable
class GenerationEngine(Protocol):
    """Generation with a KV cache behind one interface (every rank of a unit calls it with the
    same request; every rank gets the same result)."""

    name: str

    def generate(self, req: GenRequest) -> Generated:
        """Sample up to ``req.max_new_tokens`` tokens after every prompt."""
        ...

    def refresh_weights(self) -> int:
        """Make the engine generate with the unit's current weights (after a weight sync or a
        transition); returns the bytes copied into the engine (0 when it reads them in place)."""
        ...

    def kv_cache_bytes(self) -> int:
        """The bytes this rank's KV cache holds (the last batch's, or the preallocated pool)."""
        ...


class MegatronEngine:
    """Megatron-core static inference with a KV cache over a unit's GPTModel stage: the CPU
    path, exactly :func:`nereus.engines.generation.generate` with the uniforms of
    :func:`sample_uniforms` (the model must be prepared with ``enable_kv_cache``)."""

    name = MEGATRON

    def __init__(self, model: torch.nn.Module, tp_group: dist.ProcessGroup,
                 link: StageLink | None = None) -> None:
        self.model = model
        self.tp_group = tp_group
        self.link = link
        self._kv_bytes = 0

    def generate(self, req: GenRequest) -> Generated:
        u = sample_uniforms(req.seed, req.step, req.sample_ids, req.max_new_tokens)
        out = generate(self.model, self.tp_group, req.prompts, u, req.max_new_tokens,
                       req.temperature, greedy=req.greedy, link=self.link,
                       prompt_valid=req.prompt_valid, eos_ids=req.eos_ids, pad_id=req.pad_id)
        self._kv_bytes = out.kv_cache_bytes
        return out

    def refresh_weights(self) -> int:
        return 0  # generates with the unit's parameters, which the weight sync writes in place

    def kv_cache_bytes(self) -> int:
        return self._kv_bytes
