"""The global transition DAG as frozen data."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from nereus.emu.primitives import Primitive, shard_bytes
from nereus.emu.unit import Emu
from nereus.transition.residency import Exclusion, exclusion_for

# Edge kinds: "data" (a unit must exist / be read before it is consumed), "local" (a GPU of the same
# model-stage must be released before it is acquired), "resource" (the same across model-stages,
# the edges the global compiler adds), "order" (Extends reading one source run one after another),
# "memory" (on a GPU where co-resident model-stages' bytes together might not fit, its primitives
# run in batches that fit, see :mod:`memory_order`; where a primitive does not fit alone, phases
# are ordered, see :mod:`phases`, and where that does not suffice every primitive is chained).
EDGE_KINDS = ("data", "local", "resource", "order", "memory")


@dataclass(frozen=True)
class TransitionDag:
    """Primitives, edges ``(before, after, kind)`` and the deterministic priority order.

    ``order`` is a topological order obeying release-before-acquire and gen → inf → train; the
    scheduler launches ready primitives in this order. ``t_sub`` names the intermediate layout each
    model-stage goes through as ``(tp, pp)``. ``conflicts`` is the set of conflicting pairs of
    model-stages (None: every two distinct ones conflict), see :mod:`residency`.
    """

    source: tuple[Emu, ...]
    target: tuple[Emu, ...]
    primitives: tuple[Primitive, ...]
    edges: tuple[tuple[int, int, str], ...]
    order: tuple[int, ...]
    t_sub: tuple[tuple[str, int, int], ...] = ()
    conflicts: frozenset[tuple[str, str]] | None = None
    state_bytes: tuple[tuple[str, int], ...] = ()  # (model-stage, bytes of its logical state)
    replicated_bytes: tuple[tuple[str, int], ...] = ()  # (model-stage, TP-replicated part of it)

    @cached_property
    def exclusion(self) -> Exclusion:
        names = {u.model_stage for u in self.source} | {u.model_stage for u in self.target}
        return exclusion_for(names, self.conflicts)

    @cached_property
    def preds(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in self.primitives]
        for a, b, _ in self.edges:
            out[b].append(a)
        return tuple(tuple(sorted(set(p))) for p in out)

    @cached_property
    def succs(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in self.primitives]
        for a, b, _ in self.edges:
            out[a].append(b)
        return tuple(tuple(sorted(set(s))) for s in out)

    @property
    def resource_edges(self) -> tuple[tuple[int, int], ...]:
        return tuple((a, b) for a, b, k in self.edges if k == "resource")

    def without(self, kinds: tuple[str, ...]) -> TransitionDag:
        """The same primitives with the edges of ``kinds`` removed (baselines)."""
        return TransitionDag(
            self.source,
            self.target,
            self.primitives,
            tuple(e for e in self.edges if e[2] not in kinds),
            self.order,
            self.t_sub,
            self.conflicts,
            self.state_bytes,
            self.replicated_bytes,
        )

    def unit_bytes(self, u: Emu) -> int:
        """Bytes one position of a live unit ``u`` holds (0 for a model-stage it does not know)."""
        sizes = self.sizes
        return shard_bytes(sizes[0].get(u.model_stage, 0), u.layout,
                           sizes[1].get(u.model_stage, 0))

    @cached_property
    def sizes(self) -> tuple[dict[str, int], dict[str, int]]:
        """(state bytes, TP-replicated bytes) per model-stage."""
        state = dict(self.state_bytes)
        state.update({p.model_stage: p.state_bytes for p in self.primitives})
        rep = dict(self.replicated_bytes)
        rep.update({p.model_stage: p.replicated_bytes for p in self.primitives})
        return state, rep

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.primitives:
            out[type(p).__name__] = out.get(type(p).__name__, 0) + 1
        return out
