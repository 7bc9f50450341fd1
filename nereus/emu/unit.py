"""The EMU record: one replica of one model-stage on a concrete GPU set (pure data).

The tensors themselves live in the runtime; this record is what the planner, the DAG compiler and
the controller reason about.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from nereus.spec.plan import ExecutionPlan


@dataclass(frozen=True, order=True)
class Layout:
    tp: int
    pp: int

    @property
    def size(self) -> int:
        return self.tp * self.pp

    def divides(self, other: Layout) -> bool:
        """True when ``other`` can be split into ``self`` (per axis an integer factor)."""
        return other.tp % self.tp == 0 and other.pp % self.pp == 0


@dataclass(frozen=True, order=True)
class Emu:
    """⟨model-stage, layout, GPU set⟩ of one replica.

    ``gpus[pp_rank * tp + tp_rank]`` is the GPU holding that position. ``state`` names the logical
    state (units of one model-stage with the same state are replicas of it).
    """

    model_stage: str
    state: str
    layout: Layout
    gpus: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.gpus) != self.layout.size:
            raise ValueError(f"EMU of {self.model_stage}: {len(self.gpus)} GPUs for {self.layout}")
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"EMU of {self.model_stage}: repeated GPU in {self.gpus}")

    def gpu_at(self, pp_rank: int, tp_rank: int) -> int:
        return self.gpus[pp_rank * self.layout.tp + tp_rank]


def emus_of_plan(plan: ExecutionPlan, states: dict[str, str]) -> tuple[Emu, ...]:
    """The EMU collection of a placed plan; ``states`` maps model-stage name → state name."""
    out: list[Emu] = []
    for sp in plan.stages:
        for rep in sp.replicas:
            out.append(Emu(sp.name, states[sp.name], Layout(sp.tp, sp.pp), tuple(rep)))
    return tuple(out)


def t_sub_candidates(layouts: Sequence[Layout]) -> tuple[Layout, ...]:
    """Layouts every one of ``layouts`` splits into (T_sub candidates): the per-axis gcd first,
    then every layout dividing it, largest first."""
    tp = pp = 0
    for lay in layouts:
        tp, pp = math.gcd(tp, lay.tp), math.gcd(pp, lay.pp)
    cands = [Layout(t, p) for t in range(1, tp + 1) if tp % t == 0 for p in range(1, pp + 1)
             if pp % p == 0]
    return tuple(sorted(cands, key=lambda lay: (-lay.size, -lay.tp)))


@lru_cache(maxsize=1024)
def sub_layout_candidates(layouts: frozenset[tuple[int, int]]) -> tuple[Layout, ...]:
    """:func:`t_sub_candidates` of ``(tp, pp)`` pairs (cached: a plan has few distinct sets)."""
    return t_sub_candidates([Layout(tp, pp) for tp, pp in layouts])
