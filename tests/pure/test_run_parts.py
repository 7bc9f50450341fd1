"""Parts of ``nereus run`` that need no MPI job, in this process: the runtime section, memory
accounting, PPO normalization (KV-cache generation and the missing-mpiexec error, in child
processes: ranks/test_run_parts_procs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.loss_oracle import policy_loss as masked_policy_loss

from nereus.config.load import load_config
from nereus.config.run import RunConfig, parse_runtime
from nereus.errors import ConfigError
from nereus.rl.ppo import policy_loss_sum, ppo_batch, token_rewards
from nereus.runtime.worker.memory import MemoryAccount, module_state_bytes

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "ppo-tiny-cpu.yaml")


def _parse(runtime: dict[str, object], **kw: int) -> tuple[RunConfig, object]:
    cfg = load_config(EXAMPLE)
    return parse_runtime(runtime, cfg.setup, **kw)


def test_runtime_defaults_and_ranks_reshape_the_cluster() -> None:
    rc, setup = _parse({})
    assert rc.ranks == 8 and setup.cluster.nodes == 2  # type: ignore[attr-defined]
    rc, setup = _parse({}, ranks=4)
    assert (setup.cluster.nodes, setup.cluster.gpus_per_node) == (1, 4)  # type: ignore[attr-defined]
    rc, setup = _parse({"memory_per_rank_gb": 0.2})
    assert setup.cluster.gpu.memory_bytes == 200_000_000  # type: ignore[attr-defined]
    assert RunConfig.from_dict(rc.to_dict()) == rc


def test_run_plans_in_the_planners_space_and_rejects_the_distributed_optimizer() -> None:
    """``nereus run`` searches what ``nereus plan`` searches (issue 37: the runtime runs uneven
    DP and uneven pipelines), costed with static batches; a job that narrows the space keeps it
    narrowed; its units keep whole optimizer states."""
    from dataclasses import replace

    from nereus.spec.job import PlanSpace

    cfg = load_config(EXAMPLE)
    assert cfg.setup.job.space == PlanSpace()  # nereus plan / simulate: the whole space
    _, setup = parse_runtime({}, cfg.setup)
    assert setup.job.space == PlanSpace() and setup.job.static_batches  # type: ignore[attr-defined]
    narrow = PlanSpace(pipeline="even", uneven_dp=False)
    _, setup = parse_runtime({}, replace(cfg.setup, job=replace(cfg.setup.job, space=narrow)))
    assert setup.job.space == narrow  # type: ignore[attr-defined]
    sharded = replace(cfg.setup, job=replace(cfg.setup.job, distributed_optimizer=True))
    with pytest.raises(ConfigError) as exc:
        parse_runtime({}, sharded)
    assert exc.value.field == "job.distributed_optimizer"


def test_example_events_parse_and_cli_overrides_drop_those_outside_the_run() -> None:
    cfg = load_config(EXAMPLE)
    rc, _ = parse_runtime(cfg.section("runtime"), cfg.setup)
    assert [(e.at_step, e.kind, e.node) for e in rc.events] == [
        (3, "remove_node", 1), (5, "add_node", 1)]
    rc, _ = parse_runtime(cfg.section("runtime"), cfg.setup, ranks=4, steps=3)
    assert rc.events == () and rc.steps == 3


@pytest.mark.parametrize(("runtime", "kw", "field"), [
    ({"stepz": 3}, {}, "runtime.stepz"),
    ({"steps": 0}, {}, "runtime.steps"),
    ({"events": [{"at_step": 1, "remove_node": 5}]}, {}, "runtime.events[0].remove_node"),
    ({"events": [{"at_step": 1}]}, {}, "runtime.events[0]"),
    ({"events": [{"at_step": 1, "drain_node": 0}]}, {}, "runtime.events"),  # the controller's
    ({"force_transitions": [{"at_step": 0, "layouts": {"actor-train": [2, 5]}}]}, {},
     "runtime.force_transitions[0].layouts.actor-train"),
    ({"max_new_tokens": 500}, {}, "runtime.max_new_tokens"),
    ({}, {"ranks": 6}, "--ranks"),
    ({}, {"ranks": 0}, "--ranks"),  # one rank is a job (rank 0 controls and works)
    ({"inject_failure": {"rank": 9}}, {}, "runtime.inject_failure.rank"),
    ({"capacity_drop": {"at_step": 8, "memory_per_rank_gb": 0.05}}, {},
     "runtime.capacity_drop.at_step"),
    ({"capacity_drop": {"at_step": 1, "memory_per_rank_gb": 0.5}}, {},
     "runtime.capacity_drop.memory_per_rank_gb"),
    ({"capacity_drop": {"at_step": 1, "gb": 0.05}}, {}, "runtime.capacity_drop.gb"),
])
def test_runtime_errors_name_the_field(runtime: dict[str, object], kw: dict[str, int],
                                       field: str) -> None:
    with pytest.raises(ConfigError) as e:
        _parse(runtime, **kw)
    assert e.value.field == field


def test_memory_account_counts_real_bytes_and_reports_oom() -> None:
    model = torch.nn.Linear(10, 10)  # 110 fp32 values
    opt = torch.optim.Adam(model.parameters())
    assert module_state_bytes(model, opt) == 110 * 4
    model(torch.ones(1, 10)).sum().backward()
    opt.step()  # grads + exp_avg + exp_avg_sq (+ two scalar steps)
    assert module_state_bytes(model, opt) == 110 * 4 * 4 + 2 * 4
    acc = MemoryAccount(3, capacity_bytes=2000)
    acc.observe("actor-gen", 1500, 400)
    assert acc.take() == (1900, [])
    acc.observe("actor-gen", 1500, 600)
    peak, events = acc.take()
    assert peak == 2100 and [(e.global_rank, e.model_stage) for e in events] == [(3, "actor-gen")]


def test_run_account_adds_the_planner_reserve_and_applies_the_capacity_drop() -> None:
    from nereus.cost.memory import CPU_WORKSPACE_BYTES
    from nereus.runtime.worker.memory import account_for_run

    rc, setup = _parse({"memory_per_rank_gb": 0.0808,
                        "capacity_drop": {"at_step": 2, "memory_per_rank_gb": 0.07}})
    assert rc.capacity_drop == (2, 0.07) and RunConfig.from_dict(rc.to_dict()) == rc
    acc = account_for_run(1, setup, rc.capacity_drop)  # type: ignore[arg-type]
    assert acc.capacity_bytes == 80_800_000 and acc.reserve_bytes == CPU_WORKSPACE_BYTES
    used = 5_000_000  # 67.1 MB + 5 MB: under 80.8 MB, over 70 MB
    for step in range(4):
        acc.begin_step(step)
        acc.observe("actor-train", used)
        peak, events = acc.take()
        assert peak == CPU_WORKSPACE_BYTES + used
        assert [e.capacity_bytes for e in events] == ([70_000_000] if step >= 2 else [])


def test_loss_sums_over_microbatches_equal_the_minibatch_token_mean() -> None:
    g = torch.Generator().manual_seed(0)
    logp, old, adv = (torch.randn(6, 5, generator=g, dtype=torch.float64) for _ in range(3))
    mask = (torch.rand(6, 5, generator=g) > 0.3).double()
    n_tok = float(mask.sum())
    parts = sum(float(policy_loss_sum(logp[a:a + 2], old[a:a + 2], adv[a:a + 2],
                                      mask[a:a + 2], 0.2)) / n_tok for a in range(0, 6, 2))
    assert parts == pytest.approx(float(masked_policy_loss(logp, old, adv, mask, 0.2)), rel=1e-12)


def test_ppo_rewards_put_the_score_on_the_last_response_token() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    zero = torch.zeros(2, 3, dtype=torch.float64)
    r = token_rewards(torch.tensor([0.5, 1.0], dtype=torch.float64), zero, zero, mask, 0.1)
    assert r.tolist() == [[0.0, 0.5, 0.0], [0.0, 0.0, 1.0]]
    b = ppo_batch(torch.tensor([0.5, 1.0], dtype=torch.float64), zero, zero, zero, mask, 0.1, 1.0)
    assert float((b.returns * mask).sum()) == pytest.approx(0.5 * 2 + 1.0 * 3)


def test_a_drain_event_parses_and_round_trips() -> None:
    rc, _ = _parse({"events": [{"at_step": 1, "drain_node": 1}]})
    assert [(e.at_step, e.kind, e.node) for e in rc.events] == [(1, "drain_node", 1)]
    assert RunConfig.from_dict(rc.to_dict()).events == rc.events
