"""Models as the GPU ranks build them, checked on the CPU: a RoPE GPTModel from the runtime's own
builder, a whole model in bf16, and the mixed-precision optimizer (bf16 parameters, fp32 master
weights, gradients and Adam state)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from nereus.engines.megatron_model import StageGroups, build_gpt
from nereus.runtime.worker.precision import MixedPrecisionAdam
from nereus.spec.model import TINY_GPT, ModelSpec

TINY_LLAMA = ModelSpec(name="tiny-llama", num_layers=2, hidden_size=64, ffn_hidden_size=128,
                       num_attention_heads=4, num_kv_heads=2, vocab_size=96, max_seq_len=64)


@pytest.fixture(scope="module")
def groups() -> Iterator[StageGroups]:
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    w = dist.group.WORLD
    assert w is not None
    yield StageGroups(w, w, w, w, w)
    if owned:
        dist.destroy_process_group()


def test_build_gpt_builds_rope_models_like_the_conversion_builder(groups: StageGroups) -> None:
    from nereus.engines.cpu_rope import CpuRotaryEmbedding, build_rope_gpt

    ours = build_gpt(TINY_LLAMA, 1, 1, 0, groups, seed=3).eval()
    ref = build_rope_gpt(TINY_LLAMA, groups, seed=3).eval()
    assert isinstance(ours.rotary_pos_emb, CpuRotaryEmbedding)
    for (k, a), (k2, b) in zip(ours.named_parameters(), ref.named_parameters(), strict=True):
        assert k == k2 and torch.equal(a, b), k
    tokens = torch.randint(0, TINY_LLAMA.vocab_size, (2, 12))
    pos = torch.arange(12).expand(2, 12)
    with torch.no_grad():
        assert torch.equal(ours(tokens, pos, None), ref(tokens, pos, None))


def test_bf16_model_is_bf16_throughout(groups: StageGroups) -> None:
    model = build_gpt(TINY_GPT, 1, 1, 0, groups, seed=1, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    tokens = torch.randint(0, TINY_GPT.vocab_size, (2, 8))
    out = model(tokens, torch.arange(8).expand(2, 8), None)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


def test_mixed_precision_adam_accumulates_in_fp32_and_casts() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8, bias=False).to(torch.bfloat16)
    opt = MixedPrecisionAdam(list(lin.parameters()), lr=1e-2)
    p = lin.weight
    master = opt.master(p)
    assert master.dtype == torch.float32 and torch.equal(master.to(torch.bfloat16), p.data)
    x1, x2 = torch.randn(4, 16).to(torch.bfloat16), torch.randn(4, 16).to(torch.bfloat16)
    lin(x1).float().sum().backward()
    g1 = master.grad.clone()  # type: ignore[union-attr]
    assert p.grad is None and g1.dtype == torch.float32  # folded into the master at once
    lin(x2).float().sum().backward()
    want = g1 + (x2.float().sum(0).expand(8, 16).to(torch.bfloat16).float())
    assert torch.allclose(master.grad, want, atol=1e-2)  # type: ignore[arg-type]
    before = master.clone()
    opt.step()
    assert not torch.equal(master, before)  # Adam moved the fp32 master ...
    assert torch.equal(p.data, master.to(torch.bfloat16))  # ... and the parameter is its cast
    st = opt.state[p]
    assert st["exp_avg"].dtype == torch.float32 and float(st["step"]) == 1.0
    assert opt.extra_bytes() == 2 * master.numel() * 4  # masters and their gradients
    opt.zero_grad()
    assert master.grad is None and p.grad is None
    opt.close()
