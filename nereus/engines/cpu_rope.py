"""A Megatron-core GPTModel with rotary position embeddings that runs on CPU (effectful).

Megatron-core 0.16.1's ``RotaryEmbedding.get_emb`` moves ``inv_freq`` to
``torch.cuda.current_device()`` on first use, which fails without CUDA.
:class:`CpuRotaryEmbedding` computes the same table (non-interleaved, Megatron's and
Hugging Face Llama's rotate-half form) where ``inv_freq`` already is. :func:`build_rope_gpt`
builds a GPTModel like :func:`nereus.engines.megatron_model.build_gpt` but with
``position_embedding_type="rope"`` and swaps its rotary module's class for the CPU one (no
parameter changes: ``inv_freq`` is a plain attribute, not state).

The runtime's own models keep learned positions (``build_gpt``); this builder serves the
Megatron → Hugging Face conversion check (``tests/ranks/test_engines_hf_logits.py``), whose models must
use RoPE because Llama does.
"""

from __future__ import annotations

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.process_groups_config import ProcessGroupCollection

from nereus.emu.hf_layout import MEGATRON_ROPE_THETA
from nereus.engines.megatron_model import StageGroups, layer_spec, transformer_config
from nereus.spec.model import ModelSpec


class CpuRotaryEmbedding(RotaryEmbedding):
    """Megatron's RotaryEmbedding without the move of ``inv_freq`` to CUDA."""

    def get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        if self.rotary_interleaved:
            raise ValueError("CpuRotaryEmbedding supports the non-interleaved form only")
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb[:, None, None, :]  # [seq, 1, 1, dim]


def build_rope_gpt(spec: ModelSpec, groups: StageGroups, seed: int = 0,
                   rotary_base: float = MEGATRON_ROPE_THETA) -> GPTModel:
    """A tp=1, pp=1 GPTModel of ``spec`` with RoPE (``spec.learned_positions`` must be False)."""
    if spec.learned_positions:
        raise ValueError(f"{spec.name}: build_rope_gpt builds RoPE models; use build_gpt")
    if groups.tp.size() != 1 or groups.pp.size() != 1:
        raise ValueError("build_rope_gpt builds tp=1, pp=1 models")
    torch.manual_seed(seed)
    pgs = ProcessGroupCollection(
        tp=groups.tp, pp=groups.pp, cp=groups.solo, tp_cp=groups.tp, dp=groups.solo,
        dp_cp=groups.solo, embd=groups.embd, pos_embd=groups.pos_embd,
    )
    model = GPTModel(
        config=transformer_config(spec, 1, 1),
        transformer_layer_spec=layer_spec(spec),
        vocab_size=spec.vocab_size,
        max_sequence_length=spec.max_seq_len,
        pre_process=True,
        post_process=True,
        share_embeddings_and_output_weights=spec.tie_embeddings,
        position_embedding_type="rope",
        rotary_base=int(rotary_base),
        pg_collection=pgs,
    )
    model.rotary_pos_emb.__class__ = CpuRotaryEmbedding
    return model
