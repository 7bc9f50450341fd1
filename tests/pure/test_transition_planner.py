"""The controller's transition call (:func:`nereus.transition.plan_transition`) between
planner-made plans.

Real plans put model-stages of different phases on the same GPUs: Llama-3.1-8B PPO (no reward
model) on 16 H200 GPUs, plans returned by ``search_plan`` for generated lengths 1024 and 4096.
"""

from __future__ import annotations

import pytest

from nereus.cost.calibration import default_calibration
from nereus.emu.primitives import model_state_sizer
from nereus.emu.unit import emus_of_plan
from nereus.errors import TransitionError
from nereus.plan.search import search_plan
from nereus.spec.hardware import H200, ClusterSpec
from nereus.spec.job import JobSpec, Setup
from nereus.spec.model import LLAMA_3_1_8B
from nereus.spec.plan import ExecutionPlan, StagePlan
from nereus.transition import plan_transition
from nereus.transition.cost import transition_cost_s
from nereus.transition.planned import stage_states
from nereus.transition.reference.compile import check_collection
from nereus.transition.schedule import Scheduler, SimulatedExecutor, drive
from nereus.transition.validate import validate_dag

MODELS = (("actor", LLAMA_3_1_8B), ("critic", LLAMA_3_1_8B), ("reference", LLAMA_3_1_8B))
CAP = H200.memory_bytes


def _setup(gen_len: int) -> Setup:
    job = JobSpec("ppo", "sync", MODELS, global_batch=64, prompt_len=512, gen_len=gen_len,
                  gen_len_p95=gen_len * 117 // 100, reward_model=False)
    return Setup(job, ClusterSpec(2, 8, H200))


def _plan(gen_len: int, pool: tuple[int, ...]) -> ExecutionPlan:
    return search_plan(_setup(gen_len), default_calibration(), pool=pool).plan


def _check(setup: Setup, dag) -> None:
    wf = setup.job.workflow
    sizer = model_state_sizer({ms.name: setup.job.model(ms.role) for ms in wf.model_stages},
                              {ms.name: ms.trainable for ms in wf.model_stages},
                              setup.job.dtype_bytes)
    validate_dag(dag, capacity_bytes=CAP, sizer=sizer, conflicts=wf.concurrent)
    sched = Scheduler(dag, capacity_bytes=CAP)
    drive(sched, SimulatedExecutor([1.0] * len(dag.primitives)))
    assert sched.live == set(dag.target)
    assert transition_cost_s(dag, setup.cluster) > 0


@pytest.fixture(scope="module")
def plans() -> dict[str, ExecutionPlan]:
    full = tuple(range(16))
    return {"short": _plan(1024, full), "long": _plan(4096, full),
            "short8": _plan(1024, tuple(range(8))), "long8": _plan(4096, tuple(range(8)))}


def test_planner_plans_share_gpus_across_phases(plans: dict[str, ExecutionPlan]) -> None:
    setup = _setup(1024)
    units = emus_of_plan(plans["short"], stage_states(setup))
    with pytest.raises(TransitionError, match="held by"):
        check_collection(units, "plan")  # not a collection of disjoint units
    check_collection(units, "plan", setup.job.workflow.concurrent)


@pytest.mark.parametrize("cur,tgt", [("short", "long"), ("long", "short")])
def test_compile_dag_between_gen_lengths(plans: dict[str, ExecutionPlan], cur: str,
                                         tgt: str) -> None:
    assert plans[cur] != plans[tgt]
    setup = _setup(1024)
    dag = plan_transition(setup, plans[cur], plans[tgt]).dag
    assert dag.primitives
    _check(setup, dag)


def test_compile_dag_after_losing_a_node(plans: dict[str, ExecutionPlan]) -> None:
    setup = _setup(1024)
    survivors = tuple(range(8))
    # The planner's 16-GPU plans keep each trainer on one node: losing GPUs 8-15 loses the
    # last replica of one of them, which must come from a checkpoint.
    with pytest.raises(TransitionError, match=r"every replica of .*-train was lost"):
        plan_transition(setup, plans["short"], plans["short8"], survivors)
    # A 16-GPU plan with a replica of every model-stage on each node (the 8-GPU plan mirrored
    # onto GPUs 8-15): only the surviving units enter the DAG, which reaches the 8-GPU plan of
    # the other generated length.
    mirrored = ExecutionPlan(tuple(
        StagePlan(sp.name, sp.tp, sp.pp, 2 * sp.dp, sp.micro_batch, sp.grad_accum,
                  sp.recompute,
                  replicas=sp.replicas + tuple(tuple(g + 8 for g in r) for r in sp.replicas))
        for sp in plans["short8"].stages))
    dag = plan_transition(setup, mirrored, plans["long8"], survivors).dag
    assert all(g < 8 for u in dag.source for g in u.gpus)
    assert len(dag.source) == len(emus_of_plan(plans["short8"], stage_states(setup)))
    _check(setup, dag)


def _reference(setup: Setup, cur: ExecutionPlan, tgt: ExecutionPlan, pool=None):  # type: ignore[no-untyped-def]
    """What the controller compiled before the batched path: the reference compiler on the
    surviving units."""
    from nereus.emu.primitives import model_replicated_sizer
    from nereus.transition.reference.compile import compile_transition

    wf = setup.job.workflow
    models = {ms.name: setup.job.model(ms.role) for ms in wf.model_stages}
    trainable = {ms.name: ms.trainable for ms in wf.model_stages}
    units = emus_of_plan(cur, stage_states(setup))
    alive = set(pool) if pool is not None else None
    surviving = tuple(u for u in units if alive is None or alive.issuperset(u.gpus))
    return compile_transition(
        surviving, emus_of_plan(tgt, stage_states(setup)),
        model_state_sizer(models, trainable, setup.job.dtype_bytes), capacity_bytes=CAP,
        conflicts=wf.concurrent,
        replicated=model_replicated_sizer(models, trainable, setup.job.dtype_bytes))


@pytest.mark.parametrize("cur,tgt", [("short", "long"), ("long", "short"), ("short8", "long8")])
def test_batched_planning_equals_the_reference(plans: dict[str, ExecutionPlan], cur: str,
                                               tgt: str) -> None:
    """The controller plans on the batched path: same DAG and L̂_tran as the reference."""
    setup = _setup(1024)
    planned = plan_transition(setup, plans[cur], plans[tgt])
    ref = _reference(setup, plans[cur], plans[tgt])
    assert planned.batched is not None
    assert planned.dag == ref
    assert planned.cost_s == transition_cost_s(ref, setup.cluster)
