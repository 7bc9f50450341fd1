"""Pipeline-parallel training and inference of Megatron GPTModel stages over gloo (4 ranks).

From one global logical state, units at tp×pp = 1×1, 1×2, 2×2 and 1×4 each run an inference
forward, KV-cache generation (not 1×2) and one Adam step in 4 microbatches through the CPU 1F1B
schedule (``nereus.engines.pipeline``); logits, sampled tokens, loss and the parameters after the
step are compared with the 1×1 unit's. The same in ``nereus run`` on MPI ranks:
mpi/test_engines_pipeline_run.py; the CPU controller port's pipeline plans:
pure/test_engines_pipeline_port.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from nereus.emu.shards import shards_at, tensor_specs
from nereus.emu.unit import Emu, Layout
from nereus.spec.model import TINY_GPT

pytestmark = pytest.mark.slow
WORLD = 4
SPEC = TINY_GPT
# (layout, GPUs) of the units built after the pp=1 reference on GPU 0; GPU order within the unit
# is pp-major (gpus[pp_rank * tp + tp_rank]).
PHASES = ((Layout(1, 2), (1, 2)), (Layout(2, 2), (0, 1, 2, 3)), (Layout(1, 4), (3, 2, 1, 0)))


def global_state(seed: int) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, np.ndarray]] = {"param": {}, "exp_avg": {}, "exp_avg_sq": {}}
    for t in tensor_specs(SPEC):
        out["param"][t.name] = rng.standard_normal(t.global_shape).astype(np.float32) * 0.05
        out["exp_avg"][t.name] = np.zeros(t.global_shape, dtype=np.float32)
        out["exp_avg_sq"][t.name] = np.zeros(t.global_shape, dtype=np.float32)
    return out


def _batch(seed: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, SPEC.vocab_size, (8, 12), generator=g)
    return tokens, torch.roll(tokens, -1, dims=1)


def _run_unit(rank: int, emu: Emu, seed: int, kv_ready: bool) -> Any:
    """Build ``emu`` (collective), then on its ranks: logits, one step in 4 microbatches."""
    import torch
    from support.unit_training import train_step

    from nereus.engines.generation import enable_kv_cache, generate, sample_uniforms
    from nereus.runtime.execution.groups import unit_groups
    from nereus.runtime.worker.state import load_global, new_unit_state
    from nereus.runtime.worker.train import is_reporter, link_of, unit_logits

    groups = unit_groups(emu, rank, 30.0)
    if groups is None:
        return None
    st = new_unit_state(SPEC, emu, rank, groups, lr=1e-3)
    load_global(st, global_state(seed))
    if kv_ready:  # the runtime's models gather the vocab inside the output layer
        enable_kv_cache(st.model, groups.tp)
    tokens, labels = _batch(seed)
    logits = unit_logits(st, tokens)
    assert (logits is None) == (st.position[0] != emu.layout.pp - 1)
    gen = None
    if kv_ready:  # KV-cache generation through the pipeline (same result on every stage)
        prompts = tokens[:3, :4]
        g = generate(st.model, groups.tp, prompts, sample_uniforms(seed, 0, np.arange(3), 10),
                     10, link=link_of(st))
        gen = (g.tokens.numpy(), g.logp.numpy(), g.mask.numpy())
    loss = train_step(st, tokens, labels, micro_batch=2)
    grads_seen = all(p.grad is not None for p in st.model.parameters())
    torch.distributed.barrier(groups.pp)
    return {"position": st.position, "snap": st.snapshot(), "loss": loss,
            "reporter": is_reporter(st), "grads": grads_seen, "gen": gen,
            "logits": None if logits is None else logits.numpy()}


def _all_layouts(rank: int, world: int, store: Any, seed: int) -> list[Any]:
    out = [_run_unit(rank, Emu("actor-train", "ref", Layout(1, 1), (0,)), seed, True)]
    for i, (layout, gpus) in enumerate(PHASES):  # 1×2 gathers the vocab outside the model
        out.append(_run_unit(rank, Emu("actor-train", f"u{i}", layout, gpus), seed, i > 0))
    return out


def assemble(layout: Layout, parts: list[Any]) -> dict[str, np.ndarray]:
    """Global parameters from the ranks' snapshots of one unit."""
    glob = {t.name: np.full(t.global_shape, np.nan, dtype=np.float32) for t in tensor_specs(SPEC)}
    for part in parts:
        pp_rank, tp_rank = part["position"]
        for s in shards_at(SPEC, layout, pp_rank, tp_rank):
            local = part["snap"]["param"][s.local_key]
            for pc in s.pieces:
                g = tuple(slice(a, b) for a, b in zip(pc.global_.start, pc.global_.stop,
                                                      strict=True))
                lo = tuple(slice(a, b) for a, b in zip(pc.local.start, pc.local.stop,
                                                       strict=True))
                glob[s.tensor][g] = local[lo]
    return glob


@pytest.fixture
def pool() -> Any:
    from support.gloo_harness import shared_pool

    return shared_pool(WORLD)


def test_pipeline_step_matches_the_single_stage_model(pool: Any) -> None:
    seed = 11
    res = pool.run(_all_layouts, seed)
    ref = res[0][0]
    want_params = ref["snap"]["param"]  # tp1·pp1: local keys are the logical names
    before = global_state(seed)["param"]
    assert any(not np.array_equal(want_params[k], before[k]) for k in before)  # it trained
    for phase, (layout, gpus) in enumerate(PHASES, start=1):
        parts = [res[g][phase] for g in gpus]
        assert all(p["grads"] for p in parts), layout
        reporters = [p for p in parts if p["reporter"]]
        assert len(reporters) == 1 and reporters[0]["position"] == (layout.pp - 1, 0)
        last = [p for p in parts if p["position"][0] == layout.pp - 1]
        got = assemble(layout, parts)
        gens = [p["gen"] for p in parts if p["gen"] is not None]
        assert len(gens) == (0 if phase == 1 else len(parts))
        for gen in gens:  # every stage returns the tokens the last stage picked
            assert np.array_equal(gen[0], ref["gen"][0]) and np.array_equal(gen[2], ref["gen"][2])
            assert np.allclose(gen[1], ref["gen"][1], rtol=0, atol=0 if layout.tp == 1 else 1e-5)
        if layout.tp == 1:
            # pp only moves whole layers between processes: the same fp32 kernels on the same
            # shapes, activations and gradients sent bit-exactly, gradients accumulated in the
            # same microbatch order ⇒ identical to the pp=1 model (tolerance 0).
            for p in last:
                assert np.array_equal(p["logits"], ref["logits"]), layout
                assert p["loss"] == ref["loss"], layout
            for k in want_params:
                assert np.array_equal(got[k], want_params[k]), (layout, k)
        else:
            # tp=2 changes the reduction order (row-parallel partial sums all-reduced over tp,
            # the vocab gathered): fp32 rounding ~1e-7 relative in logits and gradients; Adam's
            # first step moves each parameter by about lr·sign(g), so a parameter may differ by
            # at most ~lr where a gradient is ~0; in practice differences stay below 1e-5.
            for p in last:
                assert np.allclose(p["logits"], ref["logits"], rtol=0, atol=1e-5), layout
                assert p["loss"] == pytest.approx(ref["loss"], rel=1e-6), layout
            diffs = [float(np.max(np.abs(got[k] - want_params[k]))) for k in want_params]
            assert max(diffs) < 1e-5, (layout, max(diffs))
        for p in parts:
            if p["position"][0] != layout.pp - 1:
                assert p["loss"] == 0.0 and p["logits"] is None


# ---- `nereus run`: actor-gen moved to pp=2 mid-run keeps the training semantics ----
