"""Random co-resident plans of one synchronous workflow, placed the way the planner places them.

Every phase of the lane spreads its model-stages over a random permutation of the whole pool
(disjoint GPUs inside a phase); model-stages of different phases share GPUs. Tiny models keep the
byte counts small; the capacity is drawn between the co-resident bytes of the source and target
collections and a few times that.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from nereus.emu.primitives import Extend, StateSizer, consumed, model_state_sizer, shard_bytes
from nereus.emu.unit import Emu, emus_of_plan
from nereus.spec.plan import ExecutionPlan, StagePlan
from nereus.spec.workflow import Workflow, build_workflow
from nereus.transition.reference.compile import check_collection
from nereus.transition.schedule import Scheduler
from support.transition_cases import tiny_model


@dataclass(frozen=True)
class CoresidentCase:
    workflow: Workflow
    current: ExecutionPlan
    target: ExecutionPlan
    states: dict[str, str]
    sizer: StateSizer
    pool: list[int]
    capacity_bytes: int

    @property
    def source(self) -> tuple[Emu, ...]:
        return emus_of_plan(self.current, self.states)

    @property
    def dest(self) -> tuple[Emu, ...]:
        return emus_of_plan(self.target, self.states)


def phase_plan(rng: random.Random, wf: Workflow, pool: list[int], gpn: int) -> ExecutionPlan:
    """Per phase: its model-stages on disjoint GPUs of the pool; phases overlap freely."""
    stages: dict[str, StagePlan] = {}
    for phase in wf.phases():
        free = list(pool)
        rng.shuffle(free)
        for k, name in enumerate(phase):
            left = len(free) - (len(phase) - k - 1)  # one GPU at least for each later one
            tp = rng.choice([t for t in (1, 2, 4, 8) if t <= gpn and t <= left])
            pp = rng.choice([p for p in (1, 2, 4) if tp * p <= left])
            dp = rng.randint(1, max(1, min(3, left // (tp * pp))))
            reps = []
            for _ in range(dp):
                reps.append(tuple(free[: tp * pp]))
                del free[: tp * pp]
            stages[name] = StagePlan(name, tp, pp, dp, 1, 1, replicas=tuple(reps))
    return ExecutionPlan(tuple(stages[n] for n in wf.names))


def resident_by_gpu(units: tuple[Emu, ...], sizer: StateSizer) -> dict[int, int]:
    out: dict[int, int] = {}
    for u in units:
        for g in u.gpus:
            out[g] = out.get(g, 0) + shard_bytes(sizer(u.model_stage), u.layout)
    return out


def coresident_case(seed: int) -> CoresidentCase:
    rng = random.Random(seed)
    wf = build_workflow(rng.choice(["ppo", "grpo"]), "sync", reward_model=rng.random() < 0.5)
    gpn = rng.choice([2, 4, 8])
    pool = list(range(rng.randint(1, 3) * gpn))
    if len(pool) < max(len(p) for p in wf.phases()):
        pool = list(range(2 * gpn if 2 * gpn >= 4 else 4))
    states = {n: n for n in wf.names}  # one logical state per model-stage (as the controller)
    models = {n: tiny_model(rng, n) for n in wf.names}
    sizer = model_state_sizer(models, {ms.name: ms.trainable for ms in wf.model_stages})
    cur = phase_plan(rng, wf, pool, gpn)
    tgt = phase_plan(rng, wf, pool, gpn)
    tmp = CoresidentCase(wf, cur, tgt, states, sizer, pool, 0)
    held = max(max(resident_by_gpu(tmp.source, sizer).values()),
               max(resident_by_gpu(tmp.dest, sizer).values()))
    cap = int(held * rng.choice([1.5, 2.0, 3.0, 6.0]))
    return CoresidentCase(wf, cur, tgt, states, sizer, pool, cap)


def bytes_now(sched: Scheduler, sizes: dict[str, int]) -> dict[int, int]:
    """Live units' shards plus running primitives' buffers per GPU, recomputed from scratch."""
    out: dict[int, int] = {}
    for u in sched.live:
        for g in u.gpus:
            out[g] = out.get(g, 0) + shard_bytes(sizes[u.model_stage], u.layout)
    for i in sched.running:
        p = sched.dag.primitives[i]
        ins = consumed(p) + ((p.src,) if isinstance(p, Extend) else ())
        for g, b in p.peak_bytes().items():
            own = sum(shard_bytes(sizes[u.model_stage], u.layout) for u in ins if g in u.gpus)
            out[g] = out.get(g, 0) + b - own
    return out


def run_schedule(dag, cap: int, sizes: dict[str, int], conflicts,
                 stop: int | None = None) -> Scheduler:
    """Drive the scheduler one completion at a time, checking memory and ownership throughout."""
    sched = Scheduler(dag, capacity_bytes=cap)
    done = 0
    while not sched.done and (stop is None or done < stop):
        for i in sched.ready():
            sched.start(i)
        assert sched.running, sched.stall_reason()
        assert max(bytes_now(sched, sizes).values(), default=0) <= cap
        check_collection(tuple(sched.live), "live", conflicts)
        sched.complete(min(sched.running))
        done += 1
    return sched
