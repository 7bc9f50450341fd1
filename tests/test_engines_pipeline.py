"""Pipeline-parallel training and inference of Megatron GPTModel stages over gloo (4 ranks).

From one global logical state, units at tp×pp = 1×1, 1×2, 2×2 and 1×4 each run an inference
forward, KV-cache generation (not 1×2) and one Adam step in 4 microbatches through the CPU 1F1B
schedule (``nereus.engines.pipeline``); logits, sampled tokens, loss and the parameters after the
step are compared with the 1×1 unit's. A ``nereus run`` on 2 MPI ranks then moves actor-gen to
two pipeline stages mid-run and is compared with the same run without the move.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nereus.emu.shards import shards_at, tensor_specs
from nereus.emu.unit import Emu, Layout
from nereus.spec.model import TINY_GPT

pytestmark = pytest.mark.slow
WORLD = 4
SPEC = TINY_GPT
RUN_IDS = itertools.count()
ROOT = Path(__file__).resolve().parent.parent
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
    from unit_training import train_step

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
    from gloo_harness import shared_pool

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

GRPO_2_RANKS = """
job: {algorithm: grpo, mode: sync, global_batch: 4, samples_per_prompt: 2, minibatches: 2,
      prompt_len: 8, gen_len: 12, reward_model: true}
models: {actor: tiny-gpt, reference: tiny-gpt, reward: tiny-gpt}
cluster: {nodes: 1, gpus_per_node: 2, gpu: cpu, memory_per_gpu_gb: 0.5}
"""
ADAM_LR = 1e-3  # runtime.lr default


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs mpiexec (the mpi extra)")
def test_run_with_generation_moved_to_two_pipeline_stages(tmp_path: Path) -> None:
    """GRPO on 2 ranks; the planner trains actor-train at pp=2 from the start. Forced: actor-gen
    goes from two 1×1 replicas to one 1×2 unit after step 0 (KV-cache decode through the
    pipeline, weight sync from the 1×2 trainer). Same seed → the same sampled tokens, rewards
    and lengths; the rollout log-probs come from a different generation batch split (dp 2 → 1),
    whose fp32 GEMMs may round differently (~1e-7 relative), hence the tolerances of
    tests/test_run_job.py on losses and parameters."""
    out: dict[str, dict[str, Any]] = {}
    for name, runtime in (
            ("base", "{steps: 2, adapt: false, reward: model, save_state: %s}"),
            ("forced", "{steps: 2, adapt: false, reward: model, save_state: %s, "
                       "force_transitions: [{at_step: 0, layouts: {actor-gen: [1, 2]}}]}")):
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(GRPO_2_RANKS + "runtime: " + runtime % (tmp_path / f"{name}.npz") + "\n")
        res = subprocess.run([sys.executable, "-m", "nereus", "run", str(cfg), "--log",
                              str(tmp_path / f"{name}.h5"), "--json"], capture_output=True,
                             text=True, timeout=400, cwd=ROOT)
        assert res.returncode == 0, res.stderr[-3000:]
        out[name] = json.loads(res.stdout.strip().splitlines()[-1])
    b, m = out["base"], out["forced"]
    assert all(p.split()[-1].endswith(".1.2") for p in b["plans"]), b["plans"]  # aT at pp=2
    assert m["transitions"] == 1 and m["plans"][1].split()[0] == "gen1.1.2", m["plans"]
    assert b["lengths"] == m["lengths"] and b["rewards"] == m["rewards"]
    for lb, lm in zip(b["losses"], m["losses"], strict=True):
        assert lb["actor-train"] != 0.0
        assert lm["actor-train"] == pytest.approx(lb["actor-train"], rel=1e-4, abs=1e-7)
    xb, xm = np.load(tmp_path / "base.npz"), np.load(tmp_path / "forced.npz")
    assert set(xb.files) == set(xm.files)
    diff2 = ref2 = 0.0
    for k in xb.files:
        d = xm[k].astype(np.float64) - xb[k]
        assert np.abs(d).max() <= 3 * ADAM_LR, k
        diff2 += float((d * d).sum())
        ref2 += float((xb[k].astype(np.float64) ** 2).sum())
    assert diff2 ** 0.5 <= 1e-4 * ref2 ** 0.5


# ---- the CPU controller port: pp > 1 wherever the runtime's layout rules allow it ----

PPO_8_RANKS = """
job: {algorithm: ppo, mode: sync, global_batch: 16, minibatches: 2, prompt_len: 32, gen_len: 64,
      reward_model: true}
models:
  actor: tiny-gpt
  critic: tiny-gpt
  reference: REFERENCE
  reward: {name: tiny-reward, num_layers: 2, hidden_size: 64, ffn_hidden_size: 256,
           num_attention_heads: 4, num_kv_heads: 2, vocab_size: 128, learned_positions: true,
           max_seq_len: 256}
cluster: {nodes: 2, gpus_per_node: 4, gpu: cpu, memory_per_gpu_gb: 0.5}
controller: {delta_len: 0.3, gamma: 0.5, memory_headroom: 0.1}
runtime: {steps: 8, max_new_tokens: 160, memory_per_rank_gb: 0.084}
"""
TIED_REFERENCE = ("{name: tiny-tied, num_layers: 4, hidden_size: 64, ffn_hidden_size: 256, "
                  "num_attention_heads: 4, num_kv_heads: 2, vocab_size: 128, "
                  "learned_positions: true, max_seq_len: 256, tie_embeddings: true}")


def test_cpu_port_keeps_pipeline_plans_and_pins_tied_embeddings_to_one_stage(
        tmp_path: Path) -> None:
    """The example's PPO job (tight virtual memory): the planner puts ref-inf on two pipeline
    stages, and the CPU port now keeps that; with a tied-embedding reference model (pp=1 only
    in the runtime) the port re-searches ref-inf at pp=1."""
    from nereus.config.load import load_config
    from nereus.config.run import parse_runtime
    from nereus.control.signals import Observation
    from nereus.runtime.rank0.controller import RankZeroController

    layouts = {}
    for name, ref in (("untied", "tiny-gpt"), ("tied", TIED_REFERENCE)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(PPO_8_RANKS.replace("REFERENCE", ref))
        cfg = load_config(str(path))
        _, setup = parse_runtime(cfg.section("runtime"), cfg.setup)
        port = RankZeroController(setup, adapt=True).port()
        obs = Observation(0, 64.0, 64.0, setup.cluster.all_gpus())
        planner_only = port.base.search(obs)
        found = port.search(obs)
        assert planner_only is not None and found is not None
        layouts[name] = ({sp.name: sp.pp for sp in planner_only[0].stages},
                         {sp.name: sp.pp for sp in found[0].stages})
    base_untied, cpu_untied = layouts["untied"]
    base_tied, cpu_tied = layouts["tied"]
    assert max(cpu_untied.values()) > 1 and cpu_untied == base_untied  # pp > 1 runs as planned
    assert base_tied["ref-inf"] > 1 and cpu_tied["ref-inf"] == 1  # tied: re-searched at pp=1
