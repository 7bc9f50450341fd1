"""The generation-engine interface and the Megatron → Hugging Face weight conversion on real
models (the conversion's pure checks: pure/test_engines_backend.py).

Real, no doubles: a Megatron-core GPTModel with RoPE built on CPU (``build_rope_gpt``), its
weights converted by ``nereus.emu.hf_layout`` and loaded into Hugging Face ``transformers``'
``LlamaForCausalLM`` / ``Qwen3ForCausalLM``, whose logits must match Megatron's; and the
Megatron engine behind the interface, which must be bit-identical to calling ``generate``.
One gloo process (world of 1, over a localhost TCP store), in this process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from support.hf_cases import TINY_LLAMA, TINY_QWEN3, TINY_TIED, global_weights

from nereus.emu import hf_layout
from nereus.emu.hf_layout import QWEN3, hf_config, to_hf
from nereus.spec.model import TINY_GPT, ModelSpec

# Logit agreement, fp32 on CPU. Both sides run the same math (rotate-half RoPE with
# inv_freq = base^(-2i/d), RMSNorm, SDPA attention, SiLU-gated MLP); torch's CPU kernels give
# identical results here (max |diff| measured 0.0), but the order of floating-point reductions
# is an implementation detail of each library, so the bound allows ~100 ulp of logits of
# magnitude ~5: far below the > 1 differences any wrong mapping makes (checked below).
LOGIT_ATOL = 1e-4


# -- real Megatron-core vs real transformers ---------------------------------------------------

@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    """A gloo world of one (Megatron's layers need process groups even at tp=1)."""
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
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
    glob = global_weights(spec, 3)
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
    glob = global_weights(spec, 4)
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
