"""Build a Megatron-core GPTModel from a ModelSpec at explicit tp/pp ranks, on the CPU or on a
GPU (effectful).

Process groups are passed to Megatron explicitly through a ``ProcessGroupCollection``; Megatron's
global ``parallel_state`` is never initialised here. The stock local core attention allocates on
CUDA (``parallel_state.get_global_memory_buffer``), so it is replaced by :class:`SdpaAttention`,
which calls ``torch.nn.functional.scaled_dot_product_attention`` and honours a padding mask
(:mod:`nereus.engines.masks`). Positions are learned absolute embeddings or RoPE (on the CPU
through :class:`nereus.engines.cpu_rope.CpuRotaryEmbedding`: Megatron's own moves ``inv_freq``
to CUDA), with the inverse frequencies of the spec's base and scaling.

On a GPU (``build_gpt(..., device=cuda)``) the model is allocated on the device in bf16 with
Megatron's stock attention and RoPE; the sections below describe the CPU build.

Weights are initialised with ``use_cpu_initialization=True``: Megatron draws the full (master)
weight from torch's global RNG and keeps its rank's chunk, so the same seed gives the same
master draws at every tp. Note that for the gated MLP the master chunk per rank is then read as
[gate; up] locally, so the *logical* state at different tp from one seed differs; to compare
layouts, load one global state through :func:`load_global_state` (Megatron's own metadata).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from nereus.engines import megatron_import  # noqa: F401  (before any megatron import)

# isort: split
# Megatron warns about missing Transformer Engine / Apex on import; harmless on CPU.
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from nereus.spec.model import ModelSpec, pipeline_split


class SdpaAttention(MegatronModule):
    """Causal core attention over torch SDPA; same call signature as Megatron's DotProductAttention.

    Inputs are [s, b, heads, head_dim] (keys/values with the rank's query groups); output is
    [s, b, heads * head_dim]. Without a mask the attention is causal (``is_causal=True``; a
    decode query against a longer cache: bottom-right aligned). A mask is Megatron's convention,
    boolean [b, 1, sq, sk] with True where a query must *not* attend — the causal and padding
    mask of a padded batch (:func:`nereus.engines.masks.attention_mask`), used as given.
    """

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: Any,
                 attention_type: str, attention_dropout: float | None = None,
                 softmax_scale: float | None = None, cp_comm_type: str | None = None,
                 pg_collection: ProcessGroupCollection | None = None) -> None:
        super().__init__(config=config)
        self.softmax_scale = softmax_scale
        if pg_collection is None:
            raise ValueError("SdpaAttention needs the explicit process groups (pg_collection)")
        self.tp_group = pg_collection.tp  # read by MegatronModule.sharded_state_dict

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: Any = None,
                attention_bias: Any = None, packed_seq_params: Any = None) -> torch.Tensor:
        heads, groups = query.shape[2], key.shape[2]
        if heads != groups:
            key = key.repeat_interleave(heads // groups, dim=2)
            value = value.repeat_interleave(heads // groups, dim=2)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, h, s, d]
        sq, sk = q.shape[2], k.shape[2]
        if attention_mask is not None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=~attention_mask,
                                                 scale=self.softmax_scale)
        elif sq == sk:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
        else:  # KV-cache decode: the new queries sit at the end of the key sequence
            mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.softmax_scale)
        return out.permute(2, 0, 1, 3).reshape(sq, query.shape[1], heads * query.shape[3])


@dataclass(frozen=True)
class StageGroups:
    """The explicit process groups one rank of one EMU uses (created by the runtime)."""

    tp: dist.ProcessGroup
    pp: dist.ProcessGroup
    solo: dist.ProcessGroup  # this rank alone: context-parallel / data-parallel inside the unit
    embd: dist.ProcessGroup  # first and last pipeline rank at this tp position (tied embeddings)
    pos_embd: dist.ProcessGroup  # first pipeline rank at this tp position


def transformer_config(spec: ModelSpec, tp: int, pp: int, initialize: bool = True,
                       on_device: bool = False,
                       dtype: torch.dtype = torch.float32) -> TransformerConfig:
    """Megatron's TransformerConfig for ``spec`` at tp×pp, no dropout: CPU-safe (weights drawn
    on the CPU) unless ``on_device`` (weights allocated on the current CUDA device), parameters
    and pipeline activations in ``dtype``.

    ``initialize=False`` leaves weights uninitialised (for units about to be filled). A ``pp``
    that does not divide the layers builds Megatron's uneven split
    (``num_layers_in_first/last_pipeline_stage`` from :func:`nereus.spec.model.pipeline_split`,
    the middle stages even), as the shard rules (``nereus.emu.shards``) lay it out."""
    uneven: dict[str, Any] = {}
    if pp > 1 and spec.num_layers % pp:
        first, _, last = pipeline_split(spec.num_layers, pp)
        uneven = {"num_layers_in_first_pipeline_stage": first,
                  "num_layers_in_last_pipeline_stage": last}
    return TransformerConfig(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        ffn_hidden_size=spec.ffn_hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_query_groups=spec.num_kv_heads,
        kv_channels=spec.kv_channels,
        gated_linear_unit=spec.gated_mlp,
        activation_func=F.silu if spec.gated_mlp else F.gelu,
        normalization="RMSNorm" if spec.norm == "rmsnorm" else "LayerNorm",
        layernorm_epsilon=spec.norm_eps,
        qk_layernorm=spec.qk_norm,
        add_bias_linear=False,
        add_qkv_bias=spec.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        use_cpu_initialization=not on_device,
        perform_initialization=initialize,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        **uneven,
    )


def layer_spec(spec: ModelSpec, stock_attention: bool = False) -> Any:
    """Megatron's local GPT layer spec; on the CPU its core attention swapped for
    :class:`SdpaAttention` (``stock_attention``: Megatron's own, which needs CUDA)."""
    ls = get_gpt_layer_local_spec(
        normalization="RMSNorm" if spec.norm == "rmsnorm" else "LayerNorm",
        qk_layernorm=spec.qk_norm,
    )
    if not stock_attention:
        ls.submodules.self_attention.submodules.core_attention = SdpaAttention
    return ls


def prepare_device(seed: int = 0) -> None:
    """Once per GPU process, before building models on the device: the two pieces of Megatron's
    global state that its stock attention and on-device initialisation use without taking them
    as arguments (the global memory buffer, the CUDA RNG tracker with tp rank 0: the runtime
    draws nothing from it, dropout being 0 and weights loaded from the logical state)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if getattr(parallel_state, "_GLOBAL_MEMORY_BUFFER", None) is None:
        parallel_state._set_global_memory_buffer()
    model_parallel_cuda_manual_seed(seed, tp_rank=0, ep_rank=0, etp_rank=0)


def build_gpt(spec: ModelSpec, tp: int, pp: int, pp_rank: int, groups: StageGroups,
              seed: int = 0, initialize: bool = True, device: torch.device | None = None,
              dtype: torch.dtype = torch.float32) -> GPTModel:
    """A GPTModel for pipeline stage ``pp_rank`` of a tp×pp unit; the seed fixes the master draws.

    On the CPU (``device`` None or cpu): drawn on the CPU, :class:`SdpaAttention`, learned
    positions or the CPU RoPE (:class:`nereus.engines.cpu_rope.CpuRotaryEmbedding`). On a CUDA
    device (call :func:`prepare_device` once first, with the device current): allocated on the
    device in ``dtype``, Megatron's stock attention and RoPE."""
    on_device = device is not None and device.type == "cuda"
    if groups.tp.size() != tp or groups.pp.size() != pp:
        raise ValueError(f"groups of size tp={groups.tp.size()} pp={groups.pp.size()} for {tp}x{pp}")
    torch.manual_seed(seed)
    pgs = ProcessGroupCollection(
        tp=groups.tp, pp=groups.pp, cp=groups.solo, tp_cp=groups.tp, dp=groups.solo,
        dp_cp=groups.solo, embd=groups.embd, pos_embd=groups.pos_embd,
    )
    rope = not spec.learned_positions
    extra: dict[str, Any] = {"rotary_base": spec.rope_theta} if rope else {}
    with torch.cuda.device(device) if on_device else contextlib.nullcontext():
        model = GPTModel(
            config=transformer_config(spec, tp, pp, initialize, on_device, dtype),
            transformer_layer_spec=layer_spec(spec, stock_attention=on_device),
            vocab_size=spec.vocab_size,
            max_sequence_length=spec.max_seq_len,
            pre_process=pp_rank == 0,
            post_process=pp_rank == pp - 1,
            share_embeddings_and_output_weights=spec.tie_embeddings,
            position_embedding_type="rope" if rope else "learned_absolute",
            pg_collection=pgs,
            **extra,
        )
    if rope:
        from nereus.engines.cpu_rope import CpuRotaryEmbedding, set_inv_freq

        set_inv_freq(model, spec)  # base and scaling as Hugging Face computes them
        if not on_device:
            model.rotary_pos_emb.__class__ = CpuRotaryEmbedding
    if on_device or dtype != torch.float32:
        # as Megatron's get_model: modules it builds with torch defaults (norms, learned
        # positions) onto the device too, and the whole model in the dtype (Float16Module)
        model.to(device=device if on_device else None, dtype=dtype)
    return model
