"""Tier 1 (pure): the independent schedule checker (``nereus.transition.schedule_check``).

Mutation tests: a valid schedule, then one change that breaks exactly one rule (local edges,
GPU ownership, one primitive per GPU and model-stage, memory at every instant), and the checker
names that rule and no other. The memory rule is checked against a tick-by-tick sum (the
capacity at the true peak passes, one byte less fails). On random schedules it agrees with a
replay through the runtime's scheduler (kept here as a second, unrelated implementation of the
same rules), and it imports nothing of the code whose schedules it checks.
"""

from __future__ import annotations

import ast
import dataclasses
import random
from collections.abc import Sequence

import pytest
from support.coresident_cases import coresident_case
from support.paths import REPO
from support.transition_cases import random_case

from nereus.emu.primitives import Destroy, Extend, Merge, consumed, produced
from nereus.emu.unit import Emu, Layout
from nereus.errors import TransitionError
from nereus.spec.hardware import H200, ClusterSpec
from nereus.transition.cost import durations_s
from nereus.transition.dag import TransitionDag
from nereus.transition.exact import ticks
from nereus.transition.reference.compile import compile_transition
from nereus.transition.schedule import Scheduler, simulate
from nereus.transition.schedule_check import RULES, check_schedule

CLUSTER = ClusterSpec(4, 8, H200)


def _unit(m: str, *gpus: int, tp: int = 1) -> Emu:
    return Emu(m, m[0], Layout(tp, 1), gpus)


def _rules(bad: list[str]) -> set[str]:
    return {b.split(":")[0] for b in bad}


def _valid(dag: TransitionDag, dur: Sequence[int], capacity: int | None = None) -> list[int]:
    start = [round(s) for s in simulate(dag, [float(d) for d in dur],
                                        capacity_bytes=capacity).start_s]
    assert check_schedule(dag, dur, start, capacity_bytes=capacity) == []
    return start


def test_a_consumer_before_its_input_exists_breaks_the_local_edge_rule_only() -> None:
    # a-inf moves from GPUs 0,1 to 2,3: Extend (reads the old unit), then Destroy of the old
    dag = compile_transition([_unit("a-inf", 0, 1, tp=2)], [_unit("a-inf", 2, 3, tp=2)],
                             lambda m: 10**9)
    ext, des = (next(i for i, p in enumerate(dag.primitives) if isinstance(p, kind))
                for kind in (Extend, Destroy))
    dur = [0] * 2
    dur[ext], dur[des] = 1000, 10
    start = _valid(dag, dur)
    start[des], start[ext] = 0, 10  # the Destroy runs first, on its own, then the Extend
    bad = check_schedule(dag, dur, start)
    assert _rules(bad) == {"local edge"}, bad
    assert any(f"consumes {dag.source[0]}" in b for b in bad), bad  # read, then consumed
    # a Merge started before the Extend making one of its inputs ends (and on other GPUs)
    grow = compile_transition([_unit("a-inf", 0)], [_unit("a-inf", 1, 2, tp=2)],
                              lambda m: 10**9, spare_gpus=range(4))
    dur = ticks(durations_s(grow, CLUSTER))
    start = _valid(grow, dur)
    merge = next(i for i, p in enumerate(grow.primitives) if isinstance(p, Merge))
    last = max(start[i] + dur[i] for i, p in enumerate(grow.primitives) if isinstance(p, Extend))
    assert start[merge] == last
    start[merge] -= 1  # one tick before its last input exists
    bad = check_schedule(grow, dur, start)
    assert "local edge" in _rules(bad) and "before its input" in " ".join(bad), bad


def test_an_acquisition_before_the_release_breaks_the_ownership_rule_only() -> None:
    # a and b each free one GPU the other's new replica needs
    src = [_unit("a-inf", 0), _unit("a-inf", 1), _unit("b-inf", 2), _unit("b-inf", 3)]
    tgt = [_unit("a-inf", 0), _unit("a-inf", 2), _unit("b-inf", 3), _unit("b-inf", 1)]
    dag = compile_transition(src, tgt, lambda m: 10**9)
    dur = ticks(durations_s(dag, CLUSTER))
    start = _valid(dag, dur)
    into_1 = next(i for i, p in enumerate(dag.primitives)
                  if isinstance(p, Extend) and p.new.gpus == (1,))
    frees_1 = next(i for i, p in enumerate(dag.primitives)
                   if isinstance(p, Destroy) and p.unit.gpus == (1,))
    assert start[into_1] >= start[frees_1] + dur[frees_1]
    start[frees_1] = start[into_1] + 1  # GPU 1 freed after b-inf acquired it
    bad = check_schedule(dag, dur, start)
    assert _rules(bad) == {"GPU ownership"}, bad
    assert "GPU 1" in bad[0] and "a-inf" in bad[0] and "b-inf" in bad[0]
    # co-resident model-stages may hold one GPU at once: the same schedule is then valid
    shared = dataclasses.replace(dag, conflicts=frozenset())
    assert check_schedule(shared, dur, start) == []


def test_two_primitives_of_one_model_stage_on_one_gpu_break_the_one_primitive_rule_only(
        ) -> None:
    # two Extends read the one source on GPU 0 (an "order" edge between them, not a rule)
    dag = compile_transition([_unit("a-inf", 0)],
                             [_unit("a-inf", 0), _unit("a-inf", 1), _unit("a-inf", 2)],
                             lambda m: 10**9)
    assert [k for *_, k in dag.edges] == ["order"]
    dur = ticks(durations_s(dag, CLUSTER))
    start = _valid(dag, dur)
    assert start[1] >= start[0] + dur[0]
    start[1] = start[0] + dur[0] - 1  # overlap by one tick
    bad = check_schedule(dag, dur, start)
    assert _rules(bad) == {"one primitive"} and "GPU 0" in bad[0], bad
    start[1] = start[0] + dur[0]  # back to back: no instant shared
    assert check_schedule(dag, dur, start) == []


def _coresident_pair() -> TransitionDag:
    """a-inf and b-inf share GPU 0 (co-resident) and each copies its unit to a new GPU."""
    return compile_transition([_unit("a-inf", 0), _unit("b-inf", 0)],
                              [_unit("a-inf", 0), _unit("a-inf", 1), _unit("b-inf", 0),
                               _unit("b-inf", 2)], lambda m: 100, conflicts=frozenset())


def test_concurrent_buffers_over_the_capacity_break_the_memory_rule_only() -> None:
    dag = _coresident_pair()
    dur = [10, 10]
    # GPU 0 holds both units (200 bytes); each Extend adds a 100-byte send buffer there
    assert check_schedule(dag, dur, [0, 10], capacity_bytes=300) == []  # one after the other
    bad = check_schedule(dag, dur, [0, 5], capacity_bytes=300)
    assert _rules(bad) == {"memory"}, bad
    assert "GPU 0 holds 400 bytes at 5" in bad[0]
    assert check_schedule(dag, dur, [0, 5], capacity_bytes=400) == []
    assert check_schedule(dag, dur, [0, 5], capacity_bytes=400, reserved_bytes={0: 1}) != []
    assert check_schedule(dag, dur, [0, 5]) == []  # no capacity given: no memory rule


def _tick_peak(dag: TransitionDag, dur: Sequence[int], start: Sequence[int]) -> dict[int, int]:
    """The most bytes on each GPU at any tick, summed tick by tick (no event logic)."""
    end = [s + d for s, d in zip(start, dur, strict=True)]
    made = dict.fromkeys(dag.source, 0)
    gone: dict[Emu, int] = {}
    for i, p in enumerate(dag.primitives):
        for u in produced(p):
            made[u] = end[i]
        for u in consumed(p):
            gone[u] = end[i]
    peak: dict[int, int] = {}
    for t in range(max(end) + 1):
        on: dict[int, int] = {}
        for u, t0 in made.items():
            if t0 <= t < gone.get(u, max(end) + 1):
                for g in u.gpus:
                    on[g] = on.get(g, 0) + dag.unit_bytes(u)
        for i, p in enumerate(dag.primitives):
            if start[i] <= t < end[i]:
                ins = consumed(p) + ((p.src,) if isinstance(p, Extend) else ())
                for g, b in p.peak_bytes().items():
                    b -= sum(dag.unit_bytes(u) for u in ins if g in u.gpus)
                    on[g] = on.get(g, 0) + max(0, b)
        for g, b in on.items():
            peak[g] = max(peak.get(g, 0), b)
    return peak


@pytest.mark.parametrize("seed", [1, 4, 32, 43, 75])  # 32, 43, 75: with memory edges
def test_the_memory_rule_holds_at_every_instant_to_the_byte(seed: int) -> None:
    """Co-resident random cases, timed on a coarse clock so that a tick-by-tick sum stays
    cheap: at the capacity of the true peak the schedule passes, at one byte less it fails."""
    c = coresident_case(seed)
    dag = compile_transition(c.source, c.dest, c.sizer, capacity_bytes=c.capacity_bytes,
                             conflicts=c.workflow.concurrent)
    rng = random.Random(seed)
    dur = [rng.randint(0, 6) for _ in dag.primitives]
    loose = dag.without(("resource", "order", "memory"))  # more at once than our DAG allows
    start = [round(s) for s in simulate(loose, [float(d) for d in dur]).start_s]
    peak = _tick_peak(dag, dur, start)
    top = max(peak.values())
    assert check_schedule(dag, dur, start, capacity_bytes=top) == []
    bad = check_schedule(dag, dur, start, capacity_bytes=top - 1)
    assert _rules(bad) == {"memory"}
    assert {int(b.split()[2]) for b in bad} == {g for g, b in peak.items() if b == top}


def test_every_broken_rule_is_reported_not_only_the_first() -> None:
    move = compile_transition([_unit("a-inf", 0, 1, tp=2)], [_unit("a-inf", 2, 3, tp=2)],
                              lambda m: 10**9)  # 500 MB per GPU: Extend + buffer on GPUs 0, 1
    bad = check_schedule(move, [10, 10], [0, 0], capacity_bytes=10**9 - 1)
    assert _rules(bad) == {"local edge", "one primitive", "memory"}, bad
    src = [_unit("a-inf", 0), _unit("a-inf", 1), _unit("b-inf", 2), _unit("b-inf", 3)]
    tgt = [_unit("a-inf", 0), _unit("a-inf", 2), _unit("b-inf", 3), _unit("b-inf", 1)]
    cross = compile_transition(src, tgt, lambda m: 10**9)
    dur = [10] * len(cross.primitives)
    bad = check_schedule(cross, dur, [0] * len(dur))
    assert _rules(bad) == {"GPU ownership"} and len(bad) == 2, bad  # GPUs 1 and 2
    assert set(RULES) == {"local edge", "GPU ownership", "one primitive", "memory"}
    assert check_schedule(cross, dur, [0]) == [
        f"schedule: 1 starts and {len(dur)} durations for {len(dur)} primitives"]
    assert check_schedule(cross, dur, [-1] + [0] * (len(dur) - 1))[0].startswith("schedule: ")


def _replay(dag: TransitionDag, dur: Sequence[int], start: Sequence[int],
            capacity: int | None) -> bool:
    """The same rules by replaying the schedule through the runtime's scheduler with only the
    local edges: at each instant the primitives ending then complete, then those starting then
    start (a second implementation, unrelated to the checker's interval arithmetic)."""
    n = len(dag.primitives)
    end = [start[i] + dur[i] for i in range(n)]
    if any(start[b] < end[a] for a, b, k in dag.edges if k in ("data", "local")):
        return False
    sched = Scheduler(dag.without(("resource", "order", "memory")), capacity_bytes=capacity)
    todo_at: dict[int, list[int]] = {}
    for i in range(n):
        todo_at.setdefault(start[i], []).append(i)
    for t in sorted(set(start) | set(end)):
        todo = todo_at.get(t, [])
        progress = True
        while progress:
            progress = False
            for i in sorted(sched.running):
                if end[i] <= t:
                    sched.complete(i)
                    progress = True
            for i in list(todo):
                if sched.can_start(i):
                    sched.start(i)
                    todo.remove(i)
                    progress = True
        if todo:
            return False
    return sched.done


def test_the_checker_agrees_with_a_replay_through_the_scheduler_on_random_schedules() -> None:
    """Valid schedules (ours, and ours without our resource/order/memory edges) and their
    random distortions (shifted starts, a compressed clock) of random disjoint and co-resident
    transitions: the two implementations accept and refuse the same schedules."""
    verdicts: dict[str, int] = {"valid": 0}
    for seed in range(40):
        rng = random.Random(seed)
        if seed % 2:
            got = random_case(seed)
            if got is None:
                continue
            dag, cap = got[0], None
        else:
            c = coresident_case(seed)
            try:
                dag = compile_transition(c.source, c.dest, c.sizer,
                                         capacity_bytes=c.capacity_bytes,
                                         conflicts=c.workflow.concurrent)
            except TransitionError:  # a target that does not fit: nothing to schedule
                continue
            cap = c.capacity_bytes
        if not 0 < len(dag.primitives) <= 60:
            continue
        dur = ticks(durations_s(dag, CLUSTER))
        loose = dag.without(("resource", "order", "memory"))
        for base in (dag, loose):
            start = [round(s) for s in simulate(base, [float(d) for d in dur],
                                                capacity_bytes=cap).start_s]
            for k in range(8):
                s2 = list(start)
                if k % 2:
                    s2 = [round(x * rng.uniform(0.3, 1.0)) for x in s2]
                elif k:
                    for _ in range(rng.randint(1, 3)):
                        i = rng.randrange(len(s2))
                        s2[i] = max(0, s2[i] + rng.randint(-max(dur), max(dur)))
                bad = check_schedule(dag, dur, s2, capacity_bytes=cap)
                assert (not bad) == _replay(dag, dur, s2, cap), (seed, k, bad)
                for rule in _rules(bad) or {"valid"}:
                    verdicts[rule] = verdicts.get(rule, 0) + 1
    # every rule was broken somewhere, and valid schedules were seen too
    assert set(verdicts) == {"valid", *RULES}, verdicts
    assert min(verdicts.values()) >= 3, verdicts


def test_the_checker_imports_nothing_of_what_it_checks() -> None:
    tree = ast.parse((REPO / "nereus" / "transition" / "schedule_check.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for a in node.names}
    assert imported <= {"__future__", "collections.abc", "nereus.emu.primitives",
                        "nereus.emu.unit", "nereus.transition.dag"}, imported
