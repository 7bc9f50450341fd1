"""Random placed plans of tiny models for the transition tests (shared by two test files)."""

from __future__ import annotations

import random

from nereus.emu.primitives import StateSizer, model_state_sizer
from nereus.emu.unit import Emu, emus_of_plan
from nereus.errors import TransitionError
from nereus.spec.model import ModelSpec
from nereus.spec.plan import ExecutionPlan, StagePlan
from nereus.transition.dag import TransitionDag
from nereus.transition.reference.compile import compile_plans

NAMES = ("actor-gen", "ref-inf", "reward-inf", "critic-train")


def tiny_model(rng: random.Random, name: str) -> ModelSpec:
    heads = rng.choice([2, 4, 8])
    return ModelSpec(name=name, num_layers=rng.choice([2, 4, 8]), hidden_size=16 * heads,
                     ffn_hidden_size=64 * heads, num_attention_heads=heads,
                     num_kv_heads=rng.choice([1, 2]), vocab_size=rng.choice([64, 128]))


def random_plan(rng: random.Random, names: list[str], pool: list[int], gpn: int,
                 pp_max: int) -> ExecutionPlan:
    """Random tp/pp/dp (powers of two for tp, pp) on a random permutation of the pool."""
    free = list(pool)
    rng.shuffle(free)
    stages = []
    for k, name in enumerate(names):
        left = len(free) - (len(names) - k - 1)  # leave one GPU for each later model-stage
        tp = rng.choice([t for t in (1, 2, 4, 8) if t <= gpn and t <= left])
        pp = rng.choice([p for p in (1, 2, 4) if p <= pp_max and tp * p <= left])
        dp = rng.randint(1, max(1, min(3, left // (tp * pp))))
        reps = []
        for _ in range(dp):
            reps.append(tuple(free[: tp * pp]))
            del free[: tp * pp]
        stages.append(StagePlan(name, tp, pp, dp, 1, 1, replicas=tuple(reps)))
    return ExecutionPlan(tuple(stages))


def case(seed: int) -> tuple[ExecutionPlan, ExecutionPlan, dict[str, str], StateSizer, list[int]]:
    rng = random.Random(seed)
    gpn = rng.choice([2, 4, 8])
    nodes = rng.randint(1, 4)
    pool = list(range(nodes * gpn))
    names = sorted(rng.sample(NAMES, rng.randint(1, min(4, len(pool)))))
    states = {n: n.split("-")[0] for n in names}
    models = {n: tiny_model(rng, n) for n in names}
    sizer = model_state_sizer(models, {n: n.endswith("-train") for n in names})
    cur = random_plan(rng, names, pool, gpn, 4)
    tgt = random_plan(rng, names, pool, gpn, 4)
    return cur, tgt, states, sizer, pool


def random_case(seed: int) -> tuple[TransitionDag, StateSizer] | None:
    """A compiled DAG of a random case, or None when the target is infeasible."""
    cur, tgt, states, sizer, pool = case(seed)
    try:
        return compile_plans(cur, tgt, states, sizer, spare_gpus=pool), sizer
    except TransitionError:
        return None


def source_target(seed: int) -> tuple[tuple[Emu, ...], tuple[Emu, ...]]:
    cur, tgt, states, _, _ = case(seed)
    return emus_of_plan(cur, states), emus_of_plan(tgt, states)
