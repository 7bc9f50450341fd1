"""Check a transition DAG for every topological execution, not just one.

The argument: if every two primitives that touch one GPU and belong to one model-stage or to two
conflicting ones are ordered by the DAG, then those events on that GPU happen in the same order in
every execution that starts a primitive only after its predecessors finished, and never overlap in
time. So one symbolic run in any topological order decides GPU ownership for all of them, and each
model-stage's bytes on each GPU follow the same sequence in every execution. Co-resident
model-stages (not conflicting) may interleave freely: where they do, a GPU's memory is checked
with the bound of :mod:`residency` (the largest sum of per-model-stage levels over non-conflicting
model-stages) and, where that bound exceeds the capacity, with the exact worst case over every
execution of :mod:`phases`; where every primitive on a GPU is ordered (always so without co-residency, and
where the compiler chained them with "memory" edges) its bytes follow one sequence in every
execution and the symbolic run checks them exactly. Copies: a model-stage keeps a copy throughout if one of its final units descends from a source unit through Splits and Merges only, or
else if every Destroy of it comes after an Extend whose copy survives to the end.
"""

from __future__ import annotations

from collections.abc import Mapping

from nereus.emu.primitives import (
    Destroy,
    Extend,
    StateSizer,
    consumed,
    produced,
    shard_bytes,
)
from nereus.emu.unit import Emu
from nereus.errors import TransitionError
from nereus.transition.dag import TransitionDag
from nereus.transition.phases import gpu_phases, worst_bytes
from nereus.transition.residency import ConflictSpec, excess_gpus, exclusion_for


def topological_order(dag: TransitionDag) -> list[int]:
    """Kahn's algorithm; raises when the DAG has a cycle."""
    n = len(dag.primitives)
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for a, b, _ in dag.edges:
        succ[a].append(b)
        indeg[b] += 1
    stack = [i for i in range(n) if indeg[i] == 0]
    out: list[int] = []
    while stack:
        i = stack.pop()
        out.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                stack.append(j)
    if len(out) != n:
        raise TransitionError(f"transition DAG has a cycle through {n - len(out)} primitives")
    return out


def ancestors(dag: TransitionDag, order: list[int]) -> list[int]:
    """Bitset (Python int) of the strict ancestors of every primitive."""
    preds = dag.preds
    anc = [0] * len(dag.primitives)
    for i in order:
        a = 0
        for p in preds[i]:
            a |= anc[p] | (1 << p)
        anc[i] = a
    return anc


def validate_dag(
    dag: TransitionDag,
    *,
    capacity_bytes: int | Mapping[int, int] | None = None,
    reserved_bytes: Mapping[int, int] | None = None,
    sizer: StateSizer | None = None,
    conflicts: ConflictSpec = None,
) -> None:
    """Raise :class:`TransitionError` unless the DAG is safe in every topological execution.

    ``conflicts`` (default: the relation the DAG was compiled with) tells which model-stages may
    not share a GPU.
    """
    excl = dag.exclusion if conflicts is None else exclusion_for(
        {u.model_stage for u in dag.source} | {u.model_stage for u in dag.target}, conflicts)
    order = topological_order(dag)
    if sorted(dag.order) != list(range(len(dag.primitives))):
        raise TransitionError("priority order is not a permutation of the primitives")
    pos = {i: k for k, i in enumerate(dag.order)}
    for a, b, _ in dag.edges:
        if pos[a] > pos[b]:
            raise TransitionError(f"priority order runs primitive {b} before its predecessor {a}")
    anc = ancestors(dag, order)
    prims = dag.primitives
    touching: dict[int, list[int]] = {}
    for i, p in enumerate(prims):
        for g in p.busy_gpus:
            touching.setdefault(g, []).append(i)
    loose: set[int] = set()  # GPUs with co-resident primitives the DAG leaves unordered
    for g, idxs in touching.items():
        for x in range(len(idxs)):
            for y in range(x + 1, len(idxs)):
                a, b = idxs[x], idxs[y]
                if (anc[b] >> a) & 1 or (anc[a] >> b) & 1:
                    continue
                loose.add(g)
                if excl.exclusive(prims[a].model_stage, prims[b].model_stage):
                    raise TransitionError(
                        f"GPU {g}: {type(prims[a]).__name__} of {prims[a].model_stage} and "
                        f"{type(prims[b]).__name__} of {prims[b].model_stage} are unordered"
                    )
    reserved = reserved_bytes or {}
    state_bytes, rep_bytes = dag.sizes

    def resident(u: Emu) -> int:
        m = u.model_stage
        return shard_bytes(sizer(m) if sizer is not None else state_bytes.get(m, 0), u.layout,
                           rep_bytes.get(m, 0))

    # bytes per model-stage and GPU: now (live units) and the most it ever holds (its level)
    res: dict[tuple[str, int], int] = {}
    tot: dict[int, int] = {}  # all model-stages' live bytes per GPU
    levels: dict[str, dict[int, int]] = {}

    def add_res(m: str, g: int, b: int) -> None:
        res[(m, g)] = res.get((m, g), 0) + b
        tot[g] = tot.get(g, 0) + b
        hold(m, g, res[(m, g)])

    def cap_of(g: int) -> int:
        assert capacity_bytes is not None
        return capacity_bytes if isinstance(capacity_bytes, int) else capacity_bytes[g]

    def hold(m: str, g: int, b: int) -> None:
        lv = levels.setdefault(m, {})
        if b > lv.get(g, 0):
            lv[g] = b

    live: dict[Emu, int] = {}  # unit → lineage record id
    rec_producer: list[int] = []  # -1: source
    rec_consumer: list[int] = []  # -1: alive at the end
    rec_children: list[list[int]] = []
    rec_stage: list[str] = []
    owner: dict[int, list[Emu]] = {}  # GPU → live units on it
    readers: dict[Emu, list[int]] = {}

    def new_record(u: Emu, producer: int) -> None:
        live[u] = len(rec_producer)
        rec_producer.append(producer)
        rec_consumer.append(-1)
        rec_children.append([])
        rec_stage.append(u.model_stage)

    for u in dag.source:
        if u in live:
            raise TransitionError(f"source lists {u} twice")
        new_record(u, -1)
        b = resident(u)
        for g in u.gpus:
            here = owner.setdefault(g, [])
            if any(excl.exclusive(w.model_stage, u.model_stage) for w in here):
                raise TransitionError(f"source: GPU {g} held by two conflicting units")
            here.append(u)
            add_res(u.model_stage, g, b)
    if capacity_bytes is not None:
        for g, b in tot.items():  # the source collection alone
            if g not in loose and b + reserved.get(g, 0) > cap_of(g):
                raise TransitionError(f"memory: source holds {b} bytes on GPU {g} > capacity "
                                      f"{cap_of(g)}")
    need = {v.model_stage for v in dag.target}
    copies: dict[str, int] = {}
    for u in dag.source:
        copies[u.model_stage] = copies.get(u.model_stage, 0) + 1
    for i in dag.order:
        p = prims[i]
        what = f"{type(p).__name__} #{i} of {p.model_stage}"
        ins = consumed(p) + ((p.src,) if isinstance(p, Extend) else ())
        for u in ins:
            if u not in live:
                raise TransitionError(f"{what}: input unit on GPUs {u.gpus} is not live")
            prod = rec_producer[live[u]]
            if prod >= 0 and not (anc[i] >> prod) & 1:
                raise TransitionError(f"{what}: input not produced by an ancestor")
        ms = p.model_stage
        for g, b in p.peak_bytes().items():
            inputs = sum(resident(u) for u in ins if g in u.gpus)
            hold(ms, g, res.get((ms, g), 0) - inputs + b)
            if capacity_bytes is not None and g not in loose:
                during = tot.get(g, 0) - inputs + b + reserved.get(g, 0)
                if during > cap_of(g):
                    raise TransitionError(f"memory: {what} needs {during} bytes on GPU {g} > "
                                          f"capacity {cap_of(g)}")
        if isinstance(p, Extend):
            readers.setdefault(p.src, []).append(i)
        parents: list[int] = []
        for u in consumed(p):
            for r in readers.pop(u, []):
                if not (anc[i] >> r) & 1:
                    raise TransitionError(f"{what}: consumes a unit Extend #{r} still reads")
            rid = live.pop(u)
            rec_consumer[rid] = i
            parents.append(rid)
            b = resident(u)
            for g in u.gpus:
                owner[g].remove(u)
                res[(u.model_stage, g)] -= b
                tot[g] -= b
        for u in produced(p):
            if u.model_stage != p.model_stage:
                raise TransitionError(f"{what}: produces a unit of {u.model_stage}")
            b = resident(u)
            for g in u.gpus:
                here = owner.setdefault(g, [])
                for w in here:
                    if excl.exclusive(w.model_stage, u.model_stage):
                        raise TransitionError(f"{what}: GPU {g} still held by {w.model_stage}")
                here.append(u)
                add_res(u.model_stage, g, b)
            new_record(u, i)
            for rid in parents:
                rec_children[rid].append(live[u])
        copies[p.model_stage] = copies.get(p.model_stage, 0) + len(produced(p)) - len(consumed(p))
        if p.model_stage in need and copies[p.model_stage] < 1:
            raise TransitionError(f"{what}: destroys the last copy of {p.model_stage}")
    if set(live) != set(dag.target) or len(live) != len(dag.target):
        missing = set(dag.target) - set(live)
        extra = set(live) - set(dag.target)
        raise TransitionError(f"end state differs from the target: {len(missing)} missing, "
                              f"{len(extra)} extra units")
    if capacity_bytes is not None:
        # loose GPUs: the bound of :mod:`residency`, and where it does not fit the exact worst
        # case over every execution (:mod:`phases`)
        shared = {m: {g: b for g, b in lv.items() if g in loose} for m, lv in levels.items()}
        bad = excess_gpus(shared, excl, capacity_bytes, reserved)
        by_gpu = gpu_phases(dag, [g for g, _ in bad], resident) if bad else {}
        for g, why in bad:
            limit = cap_of(g) - reserved.get(g, 0)
            worst, witness = worst_bytes(by_gpu[g], anc, limit)
            if worst > limit:
                parts = " + ".join(f"{m} {ph.nbytes}" for m, ph in witness)
                raise TransitionError(f"memory: {worst + reserved.get(g, 0)} bytes on GPU {g} "
                                      f"({parts}) > capacity {cap_of(g)} in some execution "
                                      f"(bound: {why})")
    _check_copies(dag, anc, need, rec_producer, rec_consumer, rec_children, rec_stage)


def _check_copies(
    dag: TransitionDag,
    anc: list[int],
    need: set[str],
    producer: list[int],
    consumer: list[int],
    children: list[list[int]],
    stage: list[str],
) -> None:
    """Every Destroy of a needed model-stage runs while another lineage of it is surely alive.

    A lineage (a unit and what Splits and Merges make of it) is alive from its producer until the
    last Destroy that ends it. Destroy ``d`` is safe if some other lineage was made before ``d``
    and one Destroy ending it comes after ``d`` or after a copy that survives was made.
    """
    n = len(producer)
    ends: list[frozenset[int] | None] = [None] * n  # None: survives to the end
    for r in reversed(range(n)):  # children have larger ids
        c = consumer[r]
        if c < 0:
            ends[r] = None
        elif not children[r]:
            ends[r] = frozenset({c})
        else:
            acc: set[int] = set()
            for ch in children[r]:
                e = ends[ch]
                if e is None:
                    break
                acc |= e
            else:
                ends[r] = frozenset(acc)
                continue
            ends[r] = None
    surv_mask: dict[str, int] = {}  # producers of lineages that survive (-1: from the source)
    from_source: set[str] = set()
    for r in range(n):
        if ends[r] is None:
            if producer[r] < 0:
                from_source.add(stage[r])
            else:
                surv_mask[stage[r]] = surv_mask.get(stage[r], 0) | (1 << producer[r])
    by_stage: dict[str, list[int]] = {}
    safe: list[bool] = []  # alive to the end, or ends only after a surviving copy was made
    for r in range(n):
        by_stage.setdefault(stage[r], []).append(r)
        e = ends[r]
        mask = surv_mask.get(stage[r], 0)
        safe.append(e is None or any(anc[x] & mask for x in e))
    for d, p in enumerate(dag.primitives):
        if not isinstance(p, Destroy):
            continue
        ms = p.model_stage
        if ms not in need or ms in from_source:
            continue
        mask = surv_mask.get(ms, 0)
        if anc[d] & mask:
            continue
        ok = False
        for r in by_stage.get(ms, ()):
            if consumer[r] == d:
                continue
            if producer[r] >= 0 and not (anc[d] >> producer[r]) & 1:
                continue
            e = ends[r]
            # alive at d (one of its ends comes after d), or safe in any case
            if safe[r] or (e is not None and any(x != d and (anc[x] >> d) & 1 for x in e)):
                ok = True
                break
        if not ok:
            raise TransitionError(f"Destroy #{d} of {ms} may run while no other copy is surely alive")
