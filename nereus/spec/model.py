"""Transformer architectures (decoder-only, Megatron-core GPT layout) and their parameter counts."""

from __future__ import annotations

from dataclasses import dataclass, replace

ADAM_FP32_BYTES_PER_PARAM = 12  # fp32 master weights + exp_avg + exp_avg_sq


def state_bytes_per_param(dtype_bytes: int, trainable: bool) -> int:
    """Bytes of a model-stage's logical state per parameter: the weights in ``dtype_bytes``,
    plus fp32 Adam master weights and moments (12 B) where the model-stage trains. The one
    figure the memory model, the transition DAG, the simulator and the runtime's restart
    estimate all use."""
    return dtype_bytes + (ADAM_FP32_BYTES_PER_PARAM if trainable else 0)


def pipeline_split(num_layers: int, pp: int) -> tuple[int, int, int]:
    """Layers of the first, of every middle and of the last pipeline stage of ``pp`` stages.

    Megatron's split (``decoder_first_pipeline_num_layers`` / ``decoder_last_pipeline_num_layers``,
    the middle stages even): when ``pp`` divides the layers every stage takes ``num_layers / pp``;
    otherwise the middle stages take ``m = ⌈L/pp⌉`` and the first and last share the rest
    ``r = L − (pp − 2)·m`` (first ``⌈r/2⌉``, last ``⌊r/2⌋``: the last stage also runs the output
    head), so no stage has more than ``⌈L/pp⌉`` layers; where ``r < 2`` the middle stages take
    ``⌊L/pp⌋`` instead. With ``pp == 2`` the first stage takes ``⌈L/2⌉``. With ``pp == 1`` all three
    are ``L``. Requires ``1 <= pp <= num_layers``.
    """
    if not 1 <= pp <= num_layers:
        raise ValueError(f"pp={pp} must be in [1, {num_layers}]")
    if num_layers % pp == 0:
        q = num_layers // pp
        return q, q, q
    if pp == 2:
        first = -(-num_layers // 2)
        return first, first, num_layers - first
    mid = -(-num_layers // pp)
    rest = num_layers - (pp - 2) * mid
    if rest < 2:
        mid = num_layers // pp
        rest = num_layers - (pp - 2) * mid
    first = -(-rest // 2)
    return first, mid, rest - first


def stage_layer_counts(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers of each of the ``pp`` pipeline stages (:func:`pipeline_split`)."""
    first, mid, last = pipeline_split(num_layers, pp)
    if pp == 1:
        return (num_layers,)
    return (first, *([mid] * (pp - 2)), last)


ROPE_SCALINGS = ("linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """Scaled rotary frequencies, as Hugging Face's ``rope_scaling`` / ``rope_parameters``:
    ``linear`` (every inverse frequency divided by ``factor``) or ``llama3`` (Llama 3.1's
    wavelength-dependent scaling: long wavelengths divided by ``factor``, short ones kept, the
    band between ``original_max_position_embeddings / low_freq_factor`` and ``… /
    high_freq_factor`` interpolated)."""

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelSpec:
    """One decoder-only transformer architecture.

    The layout follows Megatron-core's GPTModel: fused QKV (``num_kv_heads`` groups, with a
    bias where ``qkv_bias``: Qwen2), an optional fused gate/up MLP (SwiGLU), RMSNorm or
    LayerNorm with epsilon ``norm_eps``, untied or tied input/output embeddings, learned
    absolute positions or RoPE with base ``rope_theta`` (and ``rope_scaling``). A Hugging Face
    checkpoint's ``config.json`` gives every field (:mod:`nereus.config.hf_config`).
    """

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    vocab_size: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    gated_mlp: bool = True
    tie_embeddings: bool = False
    qk_norm: bool = False
    norm: str = "rmsnorm"  # "rmsnorm" | "layernorm"
    learned_positions: bool = False
    max_seq_len: int = 131072
    rope_theta: float = 10000.0  # Megatron's and Llama 2's default rotary base
    rope_scaling: RopeScaling | None = None
    norm_eps: float = 1e-5  # Megatron's default layernorm_epsilon
    qkv_bias: bool = False

    @property
    def kv_channels(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.kv_channels

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.kv_channels

    def _norm_params(self) -> int:
        return self.hidden_size * (1 if self.norm == "rmsnorm" else 2)

    def attention_params(self) -> int:
        qkv = (self.hidden_size + (1 if self.qkv_bias else 0)) * (self.q_size + 2 * self.kv_size)
        out = self.q_size * self.hidden_size
        qk = 2 * self.kv_channels if self.qk_norm else 0
        return qkv + out + qk + self._norm_params()

    def mlp_params(self) -> int:
        up = self.hidden_size * self.ffn_hidden_size * (2 if self.gated_mlp else 1)
        down = self.ffn_hidden_size * self.hidden_size
        return up + down + self._norm_params()

    def layer_params(self) -> int:
        return self.attention_params() + self.mlp_params()

    def embedding_params(self) -> int:
        """Input embedding (plus learned positions); the output head is counted separately."""
        pos = self.max_seq_len * self.hidden_size if self.learned_positions else 0
        return self.vocab_size * self.hidden_size + pos

    def head_params(self) -> int:
        """Final norm plus output projection (zero extra when tied to the input embedding)."""
        out = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return out + self._norm_params()

    def num_params(self) -> int:
        return self.embedding_params() + self.num_layers * self.layer_params() + self.head_params()

    def scalar_head(self) -> ModelSpec:
        """The same trunk with its own (untied) output layer whose row 0 is read as a scalar
        value head (critic and reward models: :mod:`nereus.engines.forward`)."""
        return replace(self, name=f"{self.name}+value-head", tie_embeddings=False)


# Exact public architectures (from each model's config.json).
LLAMA_3_1_8B = ModelSpec(
    name="llama-3.1-8b", num_layers=32, hidden_size=4096, ffn_hidden_size=14336,
    num_attention_heads=32, num_kv_heads=8, vocab_size=128256,
)
LLAMA_3_3_70B = ModelSpec(
    name="llama-3.3-70b", num_layers=80, hidden_size=8192, ffn_hidden_size=28672,
    num_attention_heads=64, num_kv_heads=8, vocab_size=128256,
)
QWEN3_14B = ModelSpec(
    name="qwen3-14b", num_layers=40, hidden_size=5120, ffn_hidden_size=17408,
    num_attention_heads=40, num_kv_heads=8, head_dim=128, vocab_size=151936, qk_norm=True,
    max_seq_len=40960,
)
QWEN3_32B = ModelSpec(
    name="qwen3-32b", num_layers=64, hidden_size=5120, ffn_hidden_size=25600,
    num_attention_heads=64, num_kv_heads=8, head_dim=128, vocab_size=151936, qk_norm=True,
    max_seq_len=40960,
)
# Qwen/Qwen2.5-0.5B config.json (the model of the verl step logs in shared/data/verl-logs).
QWEN2_5_0_5B = ModelSpec(
    name="qwen2.5-0.5b", num_layers=24, hidden_size=896, ffn_hidden_size=4864,
    num_attention_heads=14, num_kv_heads=2, vocab_size=151936, tie_embeddings=True,
    max_seq_len=32768,
)
# Small models that run on CPU ranks under gloo (character-level vocabulary).
TINY_GPT = ModelSpec(
    name="tiny-gpt", num_layers=4, hidden_size=64, ffn_hidden_size=256,
    num_attention_heads=4, num_kv_heads=2, vocab_size=128, learned_positions=True,
    max_seq_len=256,
)
SMALL_GPT = ModelSpec(
    name="small-gpt", num_layers=8, hidden_size=256, ffn_hidden_size=1024,
    num_attention_heads=8, num_kv_heads=4, vocab_size=128, learned_positions=True,
    max_seq_len=512,
)
# About 83 M parameters: 248 M values of state with Adam (params + exp_avg + exp_avg_sq).
MEDIUM_GPT = ModelSpec(
    name="medium-gpt", num_layers=8, hidden_size=768, ffn_hidden_size=3072,
    num_attention_heads=12, num_kv_heads=4, vocab_size=8192, learned_positions=True,
    max_seq_len=1024,
)

MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (LLAMA_3_1_8B, LLAMA_3_3_70B, QWEN3_14B, QWEN3_32B, QWEN2_5_0_5B, TINY_GPT,
              SMALL_GPT, MEDIUM_GPT)
}
