"""The generation-engine interface and the Megatron → Hugging Face weight conversion.

Real, no doubles: a Megatron-core GPTModel with RoPE built on CPU (``build_rope_gpt``), its
weights converted by ``nereus.emu.hf_layout`` and loaded into Hugging Face ``transformers``'
``LlamaForCausalLM`` / ``Qwen3ForCausalLM``, whose logits must match Megatron's; and the
Megatron engine behind the interface, which must be bit-identical to calling ``generate``.
One gloo process (world of 1), in this process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from nereus.emu import hf_layout
from nereus.emu.hf_layout import (
    LLAMA,
    QWEN3,
    UnsupportedArchitecture,
    from_hf,
    hf_architecture,
    hf_config,
    hf_shapes,
    to_hf,
)
from nereus.emu.shards import tensor_specs
from nereus.spec.model import LLAMA_3_1_8B, QWEN3_14B, TINY_GPT, ModelSpec

TINY_LLAMA = ModelSpec(name="tiny-llama", num_layers=2, hidden_size=64, ffn_hidden_size=128,
                       num_attention_heads=4, num_kv_heads=2, vocab_size=96, max_seq_len=64)
TINY_QWEN3 = ModelSpec(name="tiny-qwen3", num_layers=2, hidden_size=64, ffn_hidden_size=96,
                       num_attention_heads=8, num_kv_heads=2, head_dim=16, vocab_size=96,
                       qk_norm=True, max_seq_len=64)
TINY_TIED = ModelSpec(name="tiny-tied", num_layers=1, hidden_size=32, ffn_hidden_size=64,
                      num_attention_heads=4, num_kv_heads=4, vocab_size=40,
                      tie_embeddings=True, max_seq_len=32)
# Logit agreement, fp32 on CPU. Both sides run the same math (rotate-half RoPE with
# inv_freq = base^(-2i/d), RMSNorm, SDPA attention, SiLU-gated MLP); torch's CPU kernels give
# identical results here (max |diff| measured 0.0), but the order of floating-point reductions
# is an implementation detail of each library, so the bound allows ~100 ulp of logits of
# magnitude ~5: far below the > 1 differences any wrong mapping makes (checked below).
LOGIT_ATOL = 1e-4


def _global(spec: ModelSpec, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for t in tensor_specs(spec):
        a = rng.standard_normal(t.global_shape).astype(np.float32)
        out[t.name] = 1.0 + 0.3 * a if "layernorm" in t.name else 0.15 * a
    return out


# -- pure conversion ---------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [TINY_LLAMA, TINY_QWEN3, TINY_TIED], ids=lambda s: s.name)
def test_conversion_round_trips_bit_exact(spec: ModelSpec) -> None:
    glob = _global(spec, 0)
    hf = to_hf(spec, glob)
    assert {k: v.shape for k, v in hf.items()} == hf_shapes(spec)
    back = from_hf(spec, hf)
    assert set(back) == set(glob)
    for name, arr in glob.items():
        assert np.array_equal(back[name], arr), name
    assert ("lm_head.weight" in hf) == (not spec.tie_embeddings)


def test_qkv_split_follows_megatron_query_groups() -> None:
    """Rows tagged with (group, slot) land in q heads in order, then k and v per group."""
    spec = TINY_QWEN3  # 8 heads in 2 groups: 4 query heads per group
    d, g, per = spec.kv_channels, spec.num_kv_heads, 4
    tag = np.zeros((g * (per + 2) * d, spec.hidden_size), dtype=np.float32)
    for grp in range(g):
        for slot in range(per + 2):
            tag[(grp * (per + 2) + slot) * d:(grp * (per + 2) + slot + 1) * d] = grp * 10 + slot
    q, k, v = hf_layout.split_qkv(spec, tag)
    assert [int(q[h * d, 0]) for h in range(g * per)] == [0, 1, 2, 3, 10, 11, 12, 13]
    assert [int(k[i * d, 0]) for i in range(g)] == [4, 14]
    assert [int(v[i * d, 0]) for i in range(g)] == [5, 15]


def test_real_architectures_have_the_hf_shapes() -> None:
    shapes = hf_shapes(LLAMA_3_1_8B)
    assert len(shapes) == 1 + 32 * 9 + 2
    assert shapes["model.layers.31.self_attn.q_proj.weight"] == (4096, 4096)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (1024, 4096)
    assert shapes["model.layers.0.mlp.gate_proj.weight"] == (14336, 4096)
    assert shapes["lm_head.weight"] == (128256, 4096)
    assert hf_architecture(LLAMA_3_1_8B) == LLAMA and hf_architecture(QWEN3_14B) == QWEN3
    qwen = hf_shapes(QWEN3_14B)
    assert qwen["model.layers.0.self_attn.q_proj.weight"] == (5120, 5120)  # 40 heads × 128
    assert qwen["model.layers.0.self_attn.q_norm.weight"] == (128,)
    cfg = hf_config(QWEN3_14B, eos_token_id=1, pad_token_id=0, bos_token_id=1)
    assert cfg["architectures"] == [QWEN3] and cfg["head_dim"] == 128


@pytest.mark.parametrize(("change", "fragment"), [
    ({"learned_positions": True}, "learned absolute position embeddings"),
    ({"norm": "layernorm"}, "norm='layernorm'"),
    ({"gated_mlp": False}, "non-gated MLP"),
])
def test_architectures_vllm_cannot_load_are_rejected(change: dict[str, Any],
                                                      fragment: str) -> None:
    spec = ModelSpec(**{**vars(TINY_LLAMA), **change})
    with pytest.raises(UnsupportedArchitecture, match=fragment) as e:
        to_hf(spec, {})
    assert "\n" not in str(e.value) and "vLLM" in str(e.value)
    with pytest.raises(UnsupportedArchitecture):
        hf_architecture(TINY_GPT)  # the runtime's CPU models use learned positions


def test_unknown_or_misshapen_tensors_are_rejected() -> None:
    glob = _global(TINY_LLAMA, 1)
    with pytest.raises(UnsupportedArchitecture, match="not a tensor"):
        to_hf(TINY_LLAMA, {**glob, "decoder.layers.9.mlp.linear_fc2.weight": glob[
            "decoder.layers.0.mlp.linear_fc2.weight"]})
    with pytest.raises(UnsupportedArchitecture, match="has shape"):
        to_hf(TINY_LLAMA, {"output_layer.weight": np.zeros((3, 3), dtype=np.float32)})
    hf = to_hf(TINY_LLAMA, glob)
    del hf["model.norm.weight"]
    with pytest.raises(UnsupportedArchitecture, match="missing"):
        from_hf(TINY_LLAMA, hf)


# -- real Megatron-core vs real transformers ---------------------------------------------------

@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    """A gloo world of one (Megatron's layers need process groups even at tp=1)."""
    from nereus.runtime.mpi.rendezvous import free_port

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                world_size=1)
    yield
    if owned:
        dist.destroy_process_group()


def _megatron_rope_model(spec: ModelSpec, glob: dict[str, np.ndarray]) -> Any:
    from nereus.engines.cpu_rope import build_rope_gpt
    from nereus.engines.megatron_model import StageGroups

    w = dist.group.WORLD
    assert w is not None
    model = build_rope_gpt(spec, StageGroups(w, w, w, w, w), seed=0)
    params = dict(model.named_parameters())
    assert set(params) == set(glob)  # tp=1, pp=1: local keys are the logical names
    with torch.no_grad():
        for name, arr in glob.items():
            params[name].copy_(torch.from_numpy(arr))
    return model.eval()


def _hf_model(spec: ModelSpec, hf: dict[str, np.ndarray], **overrides: Any) -> Any:
    import transformers

    cfg = hf_config(spec, eos_token_id=1, pad_token_id=0, bos_token_id=1)
    kwargs = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type",
                                                        "torch_dtype")}
    kwargs.update(overrides)
    model: Any
    if cfg["architectures"] == [QWEN3]:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**kwargs))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kwargs))
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in hf.items()},
                                                strict=False)
    tied_head = ["lm_head.weight"] if spec.tie_embeddings else []
    assert list(missing) == tied_head and list(unexpected) == []
    return model.eval()


@pytest.mark.parametrize("spec", [TINY_LLAMA, TINY_QWEN3, TINY_TIED], ids=lambda s: s.name)
def test_converted_weights_give_megatrons_logits_in_transformers(world: None,
                                                                 spec: ModelSpec) -> None:
    glob = _global(spec, 3)
    megatron = _megatron_rope_model(spec, glob)
    tokens = torch.randint(0, spec.vocab_size, (3, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = megatron(tokens, torch.arange(20).expand(3, 20), None)
        got = _hf_model(spec, to_hf(spec, glob))(input_ids=tokens).logits
    assert ref.shape == got.shape == (3, 20, spec.vocab_size)
    assert float(ref.abs().max()) > 1.0  # weights large enough that every tensor matters
    assert float((ref - got).abs().max()) <= LOGIT_ATOL


def test_wrong_mappings_are_caught_by_the_logit_check(world: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: a contiguous [q; k; v] split, a swapped [up; gate] or another RoPE
    base each change the logits by far more than the tolerance."""
    spec = TINY_LLAMA
    glob = _global(spec, 4)
    tokens = torch.randint(0, spec.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = _megatron_rope_model(spec, glob)(tokens, torch.arange(16).expand(2, 16), None)

    def diff(hf: dict[str, np.ndarray], **overrides: Any) -> float:
        with torch.no_grad():
            return float((_hf_model(spec, hf, **overrides)(input_ids=tokens).logits - ref)
                         .abs().max())

    def contiguous(spec_: ModelSpec, qkv: np.ndarray) -> tuple[np.ndarray, ...]:
        q, kv = spec_.q_size, spec_.kv_size
        return qkv[:q], qkv[q:q + kv], qkv[q + kv:]

    good = to_hf(spec, glob)
    assert diff(good) <= LOGIT_ATOL
    assert diff(good, rope_theta=500000.0) > 100 * LOGIT_ATOL
    swapped = dict(good)
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}.mlp."
        swapped[p + "gate_proj.weight"], swapped[p + "up_proj.weight"] = (
            good[p + "up_proj.weight"], good[p + "gate_proj.weight"])
    assert diff(swapped) > 100 * LOGIT_ATOL
    monkeypatch.setattr(hf_layout, "split_qkv", contiguous)
    assert diff(to_hf(spec, glob)) > 100 * LOGIT_ATOL


# -- the Megatron engine behind the interface --------------------------------------------------

def test_megatron_engine_is_bit_identical_to_generate(world: None) -> None:
    from nereus.emu.unit import Emu, Layout
    from nereus.engines.backend import GenerationEngine, GenRequest, MegatronEngine
    from nereus.engines.generation import enable_kv_cache, generate, sample_uniforms
    from nereus.runtime.execution.groups import unit_groups
    from nereus.runtime.worker.state import new_unit_state

    emu = Emu("actor-gen", "actor-gen", Layout(1, 1), (0,))
    groups = unit_groups(emu, 0, 30)
    assert groups is not None
    st = new_unit_state(TINY_GPT, emu, 0, groups, seed=3)
    enable_kv_cache(st.model, groups.tp)
    prompts = torch.tensor([[0, 97, 98, 58], [99, 100, 101, 58], [0, 0, 97, 58]])
    ids = np.array([5, 6, 7])
    engine = MegatronEngine(st.model, groups.tp)
    assert isinstance(engine, GenerationEngine)
    assert engine.refresh_weights() == 0
    req = GenRequest(prompts, ids, seed=2, step=4, max_new_tokens=10, temperature=0.9)
    for greedy in (False, True):
        got = engine.generate(GenRequest(prompts, ids, 2, 4, 10, 0.9, greedy=greedy))
        ref = generate(st.model, groups.tp, prompts, sample_uniforms(2, 4, ids, 10), 10, 0.9,
                       greedy=greedy)
        assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.logp, ref.logp)
        assert torch.equal(got.mask, ref.mask)
        assert engine.kv_cache_bytes() == ref.kv_cache_bytes > 0
    # one row alone (another replica's slice) samples what it sampled in the batch
    alone = engine.generate(GenRequest(prompts[1:2], ids[1:2], 2, 4, 10, 0.9))
    full = engine.generate(req)
    assert torch.equal(alone.tokens[0], full.tokens[1])
    with pytest.raises(ValueError, match="do not match"):
        GenRequest(prompts, ids[:2], 2, 4, 10)
