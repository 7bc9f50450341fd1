"""Padding and stopping on real Megatron-core units (one gloo process): a left-padded batch
gives each row's logits, samples and training loss of the row alone (within 1e-5 relative), on
a RoPE model read from a Hugging Face checkpoint and on a learned-position model; generation
stops at every EOS id; without masks the padding changes the logits (the check can fail).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from support.hf_checkpoints import checkpoint

from nereus.emu.unit import Emu, Layout
from nereus.spec.model import TINY_GPT

REL_TOL = 1e-5
PAD = 0
ROWS = ([5, 9, 3, 7, 11, 4], [8, 2, 6], [12, 13, 5, 10])  # prompts of different lengths


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if owned:
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=["llama31", "tiny-gpt"])
def unit(request: Any, world: None) -> Any:
    from nereus.config.checkpoint import role_checkpoint
    from nereus.config.checkpoint_files import read_checkpoint
    from nereus.engines.generation import enable_kv_cache
    from nereus.hf.load import CheckpointSource
    from nereus.runtime.execution.groups import unit_groups
    from nereus.runtime.worker.state import new_unit_state

    emu = Emu("actor-gen", "s", Layout(1, 1), (0,))
    groups = unit_groups(emu, 0, 30.0)
    assert groups is not None
    if request.param == "tiny-gpt":  # learned absolute positions, random weights
        st = new_unit_state(TINY_GPT, emu, 0, groups, seed=4)
        with torch.no_grad():
            for p in st.model.parameters():
                p.mul_(4.0)  # logits of order one
    else:
        ck = role_checkpoint("models.actor", "actor", read_checkpoint(
            "ck", str(checkpoint(request.param))))
        st = new_unit_state(ck.spec, emu, 0, groups, initialize=False)
        CheckpointSource(ck, 0).fill(st)
    enable_kv_cache(st.model, groups.tp)
    return st


def padded(rows: tuple[list[int], ...] = ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    tokens = torch.tensor([[PAD] * (width - len(r)) + r for r in rows])
    valid = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    return tokens, valid


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) / float(b.abs().max())


def test_inference_logits_of_a_padded_row_are_the_row_alone(unit: Any) -> None:
    from nereus.runtime.worker.train import unit_logits

    tokens, valid = padded()
    got = unit_logits(unit, tokens, valid)
    unmasked = unit_logits(unit, tokens)
    assert got is not None and unmasked is not None
    worst_unmasked = 0.0
    for i, row in enumerate(ROWS):
        alone = unit_logits(unit, torch.tensor([row]))
        assert alone is not None
        n = len(row)
        assert float(alone.abs().max()) > 1.0
        assert rel(got[i, -n:], alone[0]) <= REL_TOL, i
        worst_unmasked = max(worst_unmasked, rel(unmasked[i, -n:], alone[0]))
    assert worst_unmasked > 100 * REL_TOL  # without the mask the padding shows


def test_generation_of_a_padded_batch_samples_each_row_as_alone(unit: Any) -> None:
    from nereus.engines.generation import generate, sample_uniforms

    tokens, valid = padded()
    ids = np.array([4, 5, 6])
    u = sample_uniforms(1, 2, ids, 8)
    eos = (10_000,)  # never sampled: every row runs 8 tokens
    batch = generate(unit.model, unit.groups.tp, tokens, u, 8, prompt_valid=valid, eos_ids=eos)
    for i, row in enumerate(ROWS):
        alone = generate(unit.model, unit.groups.tp, torch.tensor([row]), u[i:i + 1], 8,
                         eos_ids=eos)
        assert torch.equal(batch.tokens[i, tokens.shape[1]:], alone.tokens[0, len(row):]), i
        assert rel(batch.logp[i], alone.logp[0]) <= REL_TOL


def test_generation_stops_at_every_eos_id(unit: Any) -> None:
    from nereus.engines.generation import generate, sample_uniforms

    tokens, valid = padded()
    u = sample_uniforms(3, 0, np.array([0, 1, 2]), 10)
    free = generate(unit.model, unit.groups.tp, tokens, u, 10, prompt_valid=valid,
                    eos_ids=(10_000,))
    resp = free.tokens[:, tokens.shape[1]:]
    eos = (int(resp[0, 2]), int(resp[1, 5]))  # two stop ids, each first met in another row
    got = generate(unit.model, unit.groups.tp, tokens, u, 10, prompt_valid=valid, eos_ids=eos,
                   pad_id=PAD)
    for i in range(3):
        r = resp[i].tolist()
        stop = next((j for j, t in enumerate(r) if t in eos), None)
        n = 10 if stop is None else stop + 1
        assert got.tokens[i, tokens.shape[1]:tokens.shape[1] + n].tolist() == r[:n]
        assert got.mask[i].tolist() == [1.0] * n + [0.0] * (10 - n)
        assert (got.tokens[i, tokens.shape[1] + n:] == PAD).all()
    assert got.mask[0].sum() <= 3 and got.mask[1].sum() <= 6


def test_training_loss_and_gradients_of_a_padded_batch_are_the_rows_alone(unit: Any) -> None:
    from nereus.runtime.worker.train import unit_forward_backward

    tokens, valid = padded()

    def loss_fn(rows: list[int]) -> Any:
        def fn(i: int, logits: torch.Tensor) -> torch.Tensor:
            lp = torch.log_softmax(logits.double(), dim=-1)
            total = torch.zeros((), dtype=torch.float64)
            for b, r in enumerate(rows):
                n = len(ROWS[r])  # the row's real tokens are its last n
                nxt = tokens[r, -n + 1:] if logits.shape[1] == tokens.shape[1] else \
                    torch.tensor(ROWS[r][1:])
                total = total - lp[b, -n:-1].gather(-1, nxt.unsqueeze(-1)).sum()
            return total / 10.0
        return fn

    def grads() -> dict[str, torch.Tensor]:
        out = {n: p.grad.clone() for n, p in unit.model.named_parameters() if p.grad is not None}
        unit.optimizer.zero_grad(set_to_none=True)
        return out

    unit.optimizer.zero_grad(set_to_none=True)
    batch_loss = unit_forward_backward(unit, [tokens], loss_fn([0, 1, 2]), [valid])
    batch_grads = grads()
    alone_loss = 0.0
    for r, row in enumerate(ROWS):
        alone_loss += unit_forward_backward(unit, [torch.tensor([row])], loss_fn([r]))
    alone_grads = grads()
    assert abs(batch_loss - alone_loss) <= REL_TOL * abs(alone_loss)
    assert batch_grads.keys() == alone_grads.keys()
    for n, g in alone_grads.items():
        assert rel(batch_grads[n], g) <= REL_TOL, n
