"""Rotary position embeddings of a Megatron-core GPTModel, on the CPU and with Hugging Face's
frequencies (effectful).

Megatron-core 0.16.1's ``RotaryEmbedding.get_emb`` moves ``inv_freq`` to
``torch.cuda.current_device()`` on first use, which fails without CUDA.
:class:`CpuRotaryEmbedding` computes the same table (non-interleaved, Megatron's and
Hugging Face Llama's rotate-half form) where ``inv_freq`` already is.

:func:`set_inv_freq` gives a built model the inverse frequencies Hugging Face computes for the
spec's ``rope_theta`` and ``rope_scaling`` (``default``, ``linear``, ``llama3``: transformers'
``modeling_rope_utils``), on the CPU and on a GPU alike: Megatron's own Llama-3 scaling fixes
``low_freq_factor``, ``high_freq_factor`` and the original context (1, 4, 8192) and its linear
scaling divides positions rather than frequencies, so both are bypassed (``inv_freq`` is a plain
attribute, not state: no parameter changes). :func:`build_rope_gpt` builds a tp=1, pp=1 model
for the Megatron ↔ Hugging Face conversion checks (``tests/ranks/test_engines_hf_logits.py``).
"""

from __future__ import annotations

import math

import torch

from nereus.engines import megatron_import  # noqa: F401  (before any megatron import)

# isort: split
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.gpt.gpt_model import GPTModel

from nereus.engines.megatron_model import StageGroups, build_gpt
from nereus.spec.model import ModelSpec


class CpuRotaryEmbedding(RotaryEmbedding):
    """Megatron's RotaryEmbedding without the move of ``inv_freq`` to CUDA."""

    def get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        if self.rotary_interleaved:
            raise ValueError("CpuRotaryEmbedding supports the non-interleaved form only")
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb[:, None, None, :]  # [seq, 1, 1, dim]


def hf_inv_freq(spec: ModelSpec) -> torch.Tensor:
    """[head_dim / 2] fp32 inverse frequencies, computed as transformers computes them."""
    dim = spec.kv_channels
    inv = 1.0 / (spec.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(
        dtype=torch.float) / dim))
    sc = spec.rope_scaling
    if sc is None:
        return inv
    if sc.kind == "linear":
        return inv / sc.factor
    if sc.kind != "llama3":
        raise ValueError(f"rope scaling {sc.kind!r} is not supported")
    old = sc.original_max_position_embeddings
    low_wavelen, high_wavelen = old / sc.low_freq_factor, old / sc.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / sc.factor, inv)
    smooth = (old / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor)
    smoothed = (1 - smooth) * scaled / sc.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def set_inv_freq(model: GPTModel, spec: ModelSpec) -> None:
    """Give ``model``'s rotary embedding the inverse frequencies of :func:`hf_inv_freq` (before
    its first forward: Megatron caches the tables it makes)."""
    rope = model.rotary_pos_emb
    rope.inv_freq = hf_inv_freq(spec).to(rope.inv_freq.device)


def build_rope_gpt(spec: ModelSpec, groups: StageGroups, seed: int = 0) -> GPTModel:
    """A tp=1, pp=1 GPTModel of ``spec`` with RoPE (``spec.learned_positions`` must be False)."""
    if spec.learned_positions:
        raise ValueError(f"{spec.name}: build_rope_gpt builds RoPE models; use build_gpt")
    if groups.tp.size() != 1 or groups.pp.size() != 1:
        raise ValueError("build_rope_gpt builds tp=1, pp=1 models")
    return build_gpt(spec, 1, 1, 0, groups, seed=seed)
