"""Compile a transition between two EMU collections into one global DAG (DESIGN.md §2.3).

Per model-stage: Split (to T_sub) → Destroy (surplus) → Extend (new replicas) → Merge (to the
target). Across model-stages: a resource edge Destroy → Extend wherever an Extend needs a GPU that
a unit of a *conflicting* model-stage still holds (one that runs concurrently, see
:mod:`residency`; units of other phases of the lane stay co-resident and block nothing but
memory); release-before-acquire and gen → inf → train order the rest. Memory: each local DAG must
fit beside the bytes its co-residents keep throughout; where the co-resident bound of
:mod:`residency` still exceeds a GPU's capacity, "memory" edges run the primitives on that GPU
in batches that fit, one after another, in level order (:mod:`memory_order`); where one
primitive does not fit alone after the batches before it, they order just the phases of
co-resident model-stages that could meet above it (:mod:`phases`, exact over every execution),
and where that does not converge every primitive on that GPU is chained in priority order and the
GPU is checked one primitive at a time. Reuse: per unit the sub-unit grouping (interleaved or
contiguous) that lands most sub-units exactly on a target slot is chosen; units already equal to a target unit stay as they
are. A model-stage with no sub-unit in place keeps one *donor* copy until an Extend has copied it;
the donor is read once, later copies come from the new replicas (a broadcast tree). A circular wait
makes the compiler try, for a model-stage on the cycle, another donor, then a finer T_sub (more
sub-units land on their target GPUs), then staging the donor on spare GPUs or on source GPUs no
target needs; when nothing is left the target is infeasible and :class:`TransitionError` names the
cycle. A layout or donor choice whose buffers exceed a GPU's capacity is skipped (the reason is
reported).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from nereus.emu.primitives import (
    KIND_ORDER,
    Extend,
    Primitive,
    StateSizer,
    consumed,
    produced,
    read_only,
    shard_bytes,
)
from nereus.emu.unit import Emu, Layout, emus_of_plan, sub_layout_candidates
from nereus.errors import TransitionError
from nereus.spec.plan import ExecutionPlan
from nereus.transition.dag import TransitionDag
from nereus.transition.graph import default_stage_rank, priority_order
from nereus.transition.phases import order_for_memory
from nereus.transition.reference.local import LocalDag, local_dag
from nereus.transition.reference.memory_order import levels_of, memory_batches, with_memory_edges
from nereus.transition.residency import (
    ConflictSpec,
    Exclusion,
    excess_gpus,
    exclusion_for,
    memory_excess,
    raise_level,
)


def check_collection(units: Sequence[Emu], what: str,
                     conflicts: ConflictSpec | Exclusion = None) -> None:
    """A valid collection: one state name per model-stage, and no GPU held by two units of one
    model-stage or of two conflicting ones (co-resident units of other model-stages share it)."""
    named = {(u.model_stage, u.state) for u in units}
    if len(named) == len({m for m, _ in named}):
        held = [u.gpus for u in units]
        if len(set().union(*held)) == sum(map(len, held)):
            return  # one state per model-stage and no GPU held twice (else the checks below)
    state: dict[str, str] = {}
    for u in units:
        if state.setdefault(u.model_stage, u.state) != u.state:
            raise TransitionError(f"{what}: {u.model_stage} holds two states")
    excl = conflicts if isinstance(conflicts, Exclusion) else exclusion_for(state, conflicts)
    gpus_of: dict[str, set[int]] = {m: set() for m in state}
    for u in units:
        mine = gpus_of[u.model_stage]
        if not mine.isdisjoint(u.gpus):
            g = min(mine.intersection(u.gpus))
            raise TransitionError(f"{what}: GPU {g} held by {u.model_stage} and {u.model_stage}")
        mine.update(u.gpus)
    names = list(state)  # first-seen order: the message names the earlier holder first
    for k, a in enumerate(names):
        for b in names[k + 1:]:
            if excl.exclusive(a, b) and not gpus_of[a].isdisjoint(gpus_of[b]):
                g = min(gpus_of[a] & gpus_of[b])
                raise TransitionError(f"{what}: GPU {g} held by {a} and {b}")


def compile_transition(
    source: Sequence[Emu],
    target: Sequence[Emu],
    sizer: StateSizer,
    *,
    capacity_bytes: int | Mapping[int, int] | None = None,
    reserved_bytes: Mapping[int, int] | None = None,
    stage_rank: Mapping[str, int] | None = None,
    spare_gpus: Sequence[int] = (),
    conflicts: ConflictSpec = None,
    replicated: StateSizer | None = None,
) -> TransitionDag:
    """The global DAG from any valid EMU collection ``source`` to the collection ``target``.

    ``conflicts`` tells which model-stages run concurrently (a predicate such as
    ``Workflow.concurrent`` or the set of conflicting pairs; None: all distinct ones conflict).
    Units of non-conflicting model-stages may share GPUs; their bytes add up in the memory check.
    ``spare_gpus`` (held by nobody, needed by no target) and source GPUs no target needs may
    stage a copy of a state whose last copy sits on GPUs another model-stage's target needs,
    breaking a circular wait. ``replicated`` gives the bytes of each state that every TP rank
    holds whole (see :mod:`primitives`; None: none).
    """
    excl = exclusion_for({u.model_stage for u in source} | {v.model_stage for v in target},
                         conflicts)
    check_collection(source, "source", excl)
    check_collection(target, "target", excl)
    src_state = {u.model_stage: u.state for u in source}
    for v in target:
        if v.model_stage not in src_state:
            raise TransitionError(f"{v.model_stage}: no unit of the source holds its state")
        if src_state[v.model_stage] != v.state:
            raise TransitionError(f"{v.model_stage}: source state {src_state[v.model_stage]!r} "
                                  f"is not the target's {v.state!r}")
    rank = dict(stage_rank or {})
    names = sorted(src_state, key=lambda m: (rank.get(m, default_stage_rank(m)), m))
    tgt_set = {(v.model_stage, v.gpus, v.layout.tp, v.layout.pp) for v in target}
    by_src: dict[str, list[Emu]] = {m: [] for m in names}
    in_place: dict[str, list[Emu]] = {m: [] for m in names}
    by_tgt: dict[str, list[Emu]] = {m: [] for m in names}
    src_keys = [(u.model_stage, u.gpus, u.layout.tp, u.layout.pp) for u in source]
    for u, key in zip(source, src_keys, strict=True):
        (by_src if key not in tgt_set else in_place)[u.model_stage].append(u)
    src_set = set(src_keys)
    for v in target:
        if (v.model_stage, v.gpus, v.layout.tp, v.layout.pp) not in src_set:
            by_tgt[v.model_stage].append(v)
    src_gpus: dict[str, set[int]] = {m: set() for m in names}
    tgt_gpus: dict[str, set[int]] = {m: set() for m in names}
    for u in source:
        src_gpus[u.model_stage].update(u.gpus)
    for v in target:
        tgt_gpus[v.model_stage].update(v.gpus)
    all_held = frozenset().union(*src_gpus.values())
    all_target = frozenset().union(*tgt_gpus.values())
    if excl.pairs is None:
        held_for = dict.fromkeys(names, all_held)
        target_for = dict.fromkeys(names, all_target)
    else:  # only units of conflicting model-stages (and its own) hold a GPU against m
        held_for = {m: frozenset().union(*(src_gpus[c] for c in names if excl.exclusive(m, c)))
                    for m in names}
        target_for = {m: frozenset().union(*(tgt_gpus[c] for c in names
                                             if excl.exclusive(m, c))) for m in names}
    rep_of = {m: replicated(m) if replicated is not None else 0 for m in src_state}

    def unit_bytes(m: str, layout: Layout) -> int:
        return shard_bytes(sizer(m), layout, rep_of[m])

    floors = _floors(source, target, unit_bytes) if capacity_bytes is not None \
        and excl.pairs is not None else {}
    load_for: dict[str, dict[int, int]] = {}
    for m in names if floors else ():
        load = load_for.setdefault(m, {})
        for c, fl in floors.items():
            if not excl.exclusive(m, c):
                for g, b in fl.items():
                    load[g] = load.get(g, 0) + b
    cands = {m: sub_layout_candidates(frozenset((u.layout.tp, u.layout.pp)
                                      for u in (by_src[m] or in_place[m]) + by_tgt[m]))
             for m in names}
    choice = {m: [0, 0] for m in names}  # (T_sub candidate, donor rank) per model-stage
    # staging GPUs: free ones first, then ones the source holds and no target needs (after the
    # Destroy that frees them, which the resource edges order first)
    spare = [g for g in sorted(set(spare_gpus)) if g not in all_held and g not in all_target]
    released = sorted(g for g in all_held if g not in all_target)
    staging: dict[str, tuple[int, ...]] = {}
    sizes = tuple((m, sizer(m)) for m in sorted(names))
    rep_sizes = tuple((m, rep_of[m]) for m in sorted(names)) if replicated is not None else ()

    def fits(m: str, loc: LocalDag) -> str | None:
        """Memory of ``m``'s local DAG beside what its co-residents keep throughout."""
        if capacity_bytes is None:
            return None
        if excl.pairs is None and isinstance(capacity_bytes, int) and not reserved_bytes:
            # no GPU is shared: the largest peak alone decides (the reason, if any, below)
            top = max([max(p.peak_bytes().values()) for p in loc.prims], default=0)
            if in_place[m]:
                top = max(top, max(unit_bytes(m, u.layout) for u in in_place[m]))
            if top <= capacity_bytes:
                return None
        lv = loc.levels
        for p in loc.prims:
            for g, b in p.peak_bytes().items():
                if b > lv.get(g, 0):
                    lv[g] = b
        for u in in_place[m]:
            b = unit_bytes(m, u.layout)
            for g in u.gpus:
                if b > lv.get(g, 0):
                    lv[g] = b
        levels: dict[str, Mapping[int, int]] = {m: lv}
        for c, fl in floors.items():
            if c != m and not excl.exclusive(m, c):
                levels[c] = {g: fl[g] for g in lv if g in fl}
        return memory_excess(levels, excl, capacity_bytes, reserved_bytes)

    def local_for(m: str) -> LocalDag | None:
        """The local DAG at ``choice[m]`` or the next choice that compiles (None: none left)."""
        if not by_tgt[m]:
            loc = local_dag(by_src[m], [], Layout(1, 1), sizer(m), held_for[m], target_for[m],
                            replicated_bytes=rep_of[m])
            assert loc is not None
            fits(m, loc)  # a model-stage that only leaves: its levels, nothing to choose
            return loc
        while choice[m][0] < len(cands[m]):
            loc = local_dag(by_src[m], by_tgt[m], cands[m][choice[m][0]], sizer(m),
                             held_for[m], target_for[m], in_place[m], choice[m][1],
                             staging.get(m, ()), load_for.get(m), rep_of[m])
            if loc is not None:
                why = fits(m, loc)
                if why is None:
                    return loc
                memory_reason.setdefault(m, why)
                if loc.donor:  # another donor may sit on GPUs with more room
                    choice[m][1] += 1
                    continue
            choice[m] = [choice[m][0] + 1, 0]
        return None

    memory_reason: dict[str, str] = {}
    locs: dict[str, LocalDag] = {}
    for m in names:
        loc = local_for(m)
        if loc is None:
            raise TransitionError(memory_reason.get(m) or f"{m}: no copy of its state can reach "
                                  "the target GPUs (every copy sits on GPUs its target needs)")
        locs[m] = loc
    exhausted: set[str] = set()
    while True:
        dag, cycle = _assemble(source, target, names, locs, rank, excl, sizes, rep_sizes)
        if not cycle:
            break
        for m in dict.fromkeys(cycle):  # another donor or a finer T_sub for one of them
            if not locs[m].donor or m in exhausted:
                continue
            saved = list(choice[m])
            choice[m][1] += 1
            loc = local_for(m)
            if loc is not None:
                locs[m] = loc
                break
            choice[m] = saved
            exhausted.add(m)
        else:
            stage_m, lay = None, None
            for pool_name in ("spare", "released"):
                for m in dict.fromkeys(cycle):
                    lay = locs[m].t_sub
                    avail = spare if pool_name == "spare" else released
                    if locs[m].donor and not locs[m].staged and lay is not None \
                            and len(avail) >= lay.size:
                        stage_m = m
                        break
                if stage_m is not None:
                    break
            if stage_m is not None and lay is not None:  # stage its donor on spare GPUs
                if len(spare) >= lay.size:
                    staging[stage_m], spare = tuple(spare[: lay.size]), spare[lay.size:]
                else:
                    staging[stage_m], released = tuple(released[: lay.size]), released[lay.size:]
                loc = local_for(stage_m)
                if loc is None:
                    raise TransitionError(memory_reason.get(stage_m)
                                          or f"{stage_m}: staging its donor does not compile")
                locs[stage_m] = loc
                exhausted.clear()
                continue
            mem = [memory_reason[m] for m in dict.fromkeys(cycle) if m in memory_reason]
            raise TransitionError("circular wait between model-stages: " + " → ".join(cycle)
                                  + " (each keeps the last copy of its state on GPUs another's "
                                  "target needs)" + (f"; finer layouts exceed memory: {mem[0]}"
                                                     if mem else ""))
    if capacity_bytes is not None and excl.pairs is not None:
        # co-resident model-stages: their chosen local DAGs' bytes together; where the bound
        # does not fit, run the primitives on the GPU in batches by level (see
        # :mod:`memory_order`); where a batch does not fit, order just the phases that would
        # meet above capacity (see :mod:`phases`), and where that fails chain the GPU in
        # priority order
        bad = excess_gpus({m: locs[m].levels for m in names}, excl, capacity_bytes,
                          reserved_bytes)
        if bad:
            reserved = reserved_bytes or {}

            def limit(g: int) -> int:
                cap = capacity_bytes if isinstance(capacity_bytes, int) else capacity_bytes[g]
                return cap - reserved.get(g, 0)

            n = len(dag.primitives)
            by_level = [lv * n + i for i, lv in enumerate(levels_of(dag))]
            batched, over = memory_batches(dag, [g for g, _ in bad], unit_bytes, limit, by_level)
            if over is None:
                return with_memory_edges(dag, batched, _priority_keys(dag.primitives, rank))
            extra, failed = order_for_memory(dag, [g for g, _ in bad], limit)
            dag = replace(dag, edges=dag.edges + extra)
            if failed:
                left = set(failed)
                dag = _chain_gpus(dag, [(g, why) for g, why in bad if g in left], unit_bytes,
                                  capacity_bytes, reserved)
    return dag


def _chain_gpus(
    dag: TransitionDag,
    bad: list[tuple[int, str]],
    unit_bytes: Callable[[str, Layout], int],
    capacity_bytes: int | Mapping[int, int],
    reserved: Mapping[int, int],
) -> TransitionDag:
    """``dag`` with "memory" edges chaining, in priority order, the primitives on each GPU of
    ``bad``; raises when even one primitive at a time does not fit there.

    Edges between consecutive primitives of a topological order keep it topological, so the
    DAG stays acyclic and ``order`` stays valid.
    """
    prims = dag.primitives
    seqs: dict[int, list[int]] = {g: [] for g, _ in bad}
    for i in dag.order:
        for g in prims[i].busy_gpus:
            if g in seqs:
                seqs[g].append(i)

    shard: dict[tuple[str, int, int], int] = {}

    def add(acc: dict[int, int], units: tuple[Emu, ...], sign: int) -> None:
        for u in units:
            key = (u.model_stage, u.layout.tp, u.layout.pp)
            b = shard.get(key)
            if b is None:
                b = shard[key] = unit_bytes(u.model_stage, u.layout)
            b *= sign
            for g in u.gpus:
                if g in seqs:
                    acc[g] = acc.get(g, 0) + b

    now: dict[int, int] = {}  # bytes on each chained GPU between its primitives
    add(now, dag.source, 1)
    pending = {g: 0 for g in seqs}  # position reached in each GPU's chain
    have = set(dag.edges)
    extra: list[tuple[int, int, str]] = []
    why_of = dict(bad)
    for i in dag.order:  # one pass: every chain in its own order
        p = prims[i]
        here = [g for g in p.busy_gpus if g in seqs]
        if not here:
            continue
        inputs: dict[int, int] = {}
        add(inputs, consumed(p) + read_only(p), 1)
        peak = p.peak_bytes()
        for g in here:
            cap = capacity_bytes if isinstance(capacity_bytes, int) else capacity_bytes[g]
            during = now.get(g, 0) - inputs.get(g, 0) + peak[g] + reserved.get(g, 0)
            if during > cap:
                raise TransitionError(
                    f"co-resident model-stages exceed memory: {why_of[g]}; one primitive at a "
                    f"time, {type(p).__name__} of {p.model_stage} still needs {during} bytes "
                    f"on GPU {g}")
            k = pending[g]
            if k:
                e = (seqs[g][k - 1], i, "memory")
                if e not in have:
                    have.add(e)
                    extra.append(e)
            pending[g] = k + 1
        add(now, produced(p), 1)
        add(now, consumed(p), -1)
    return replace(dag, edges=dag.edges + tuple(extra))


def _floors(source: Sequence[Emu], target: Sequence[Emu],
            unit_bytes: Callable[[str, Layout], int]) -> dict[str, dict[int, int]]:
    """Per model-stage and GPU the bytes it holds there both before and after the transition
    (the smaller of its source and target shards there; 0 where it holds none in either)."""
    before: dict[str, dict[int, int]] = {}
    after: dict[str, dict[int, int]] = {}
    for units, out in ((source, before), (target, after)):
        for u in units:
            raise_level(out, u.model_stage,
                        dict.fromkeys(u.gpus, unit_bytes(u.model_stage, u.layout)))
    return {m: {g: min(b, after[m][g]) for g, b in lv.items() if g in after.get(m, {})}
            for m, lv in before.items()}


def _assemble(
    source: Sequence[Emu],
    target: Sequence[Emu],
    names: list[str],
    locs: dict[str, LocalDag],
    rank: Mapping[str, int],
    excl: Exclusion,
    sizes: tuple[tuple[str, int], ...],
    rep_sizes: tuple[tuple[str, int], ...] = (),
) -> tuple[TransitionDag, list[str]]:
    prims: list[Primitive] = []
    edges: list[tuple[int, int, str]] = []
    release: dict[int, list[int]] = {}  # GPU → Destroys (of any model-stage) that free it
    stage_of: list[str] = []
    for m in names:
        off = len(prims)
        loc = locs[m]
        prims.extend(loc.prims)
        stage_of += [m] * len(loc.prims)
        edges.extend((a + off, b + off, k) for a, b, k in loc.edges)
        for g, d in loc.release.items():
            release.setdefault(g, []).append(d + off)
    for i, p in enumerate(prims):
        if isinstance(p, Extend):
            ms = stage_of[i]
            frees = {d for g in p.new.gpus for d in release.get(g, ())}
            for d in sorted(frees):
                if excl.conflicts(stage_of[d], ms):
                    edges.append((d, i, "resource"))
    edges = list(dict.fromkeys(edges))
    n = len(prims)
    order = priority_order(n, edges, _priority_keys(prims, rank))
    t_sub = tuple((m, lay.tp, lay.pp) for m in names if (lay := locs[m].t_sub) is not None)
    dag = TransitionDag(tuple(source), tuple(target), tuple(prims), tuple(edges), tuple(order),
                        t_sub, excl.pairs, sizes, rep_sizes)
    if len(order) == n:
        return dag, []
    succ: list[list[int]] = [[] for _ in range(n)]
    for a, b, _ in edges:
        succ[a].append(b)
    return dag, _cycle_names(prims, succ, set(range(n)) - set(order))


def _priority_keys(prims: Sequence[Primitive], rank: Mapping[str, int]
                   ) -> list[tuple[int, int, str, int]]:
    """Per primitive its priority key: release first, then gen → inf → train, then index."""
    return [(KIND_ORDER[type(p)], rank.get(p.model_stage, default_stage_rank(p.model_stage)),
             p.model_stage, i) for i, p in enumerate(prims)]


def _cycle_names(prims: list[Primitive], succ: list[list[int]], left: set[int]) -> list[str]:
    """Model-stages along one cycle among the nodes Kahn's algorithm could not order."""
    preds: dict[int, list[int]] = {j: [] for j in left}
    for a in left:
        for b in succ[a]:
            if b in left:
                preds[b].append(a)
    seen: dict[int, int] = {}
    path: list[int] = []
    i = min(left)
    while i not in seen:  # every unordered node has an unordered predecessor: walk back
        seen[i] = len(path)
        path.append(i)
        i = preds[i][0]
    cyc = path[seen[i]:][::-1]
    out: list[str] = []
    for j in cyc:
        if not out or out[-1] != prims[j].model_stage:
            out.append(prims[j].model_stage)
    return out


def compile_plans(
    current: ExecutionPlan,
    target: ExecutionPlan,
    states: Mapping[str, str],
    sizer: StateSizer,
    *,
    capacity_bytes: int | Mapping[int, int] | None = None,
    reserved_bytes: Mapping[int, int] | None = None,
    stage_rank: Mapping[str, int] | None = None,
    spare_gpus: Sequence[int] = (),
    conflicts: ConflictSpec = None,
    replicated: StateSizer | None = None,
) -> TransitionDag:
    """:func:`compile_transition` between two placed plans of one workflow."""
    st = dict(states)
    return compile_transition(emus_of_plan(current, st), emus_of_plan(target, st), sizer,
                              capacity_bytes=capacity_bytes, reserved_bytes=reserved_bytes,
                              stage_rank=stage_rank, spare_gpus=spare_gpus, conflicts=conflicts,
                              replicated=replicated)
