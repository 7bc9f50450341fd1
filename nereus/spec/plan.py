"""Execution plans: a parallel layout and GPU placement for every model-stage (frozen data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Candidate:
    """A parallel layout and batch split of one model-stage, before GPUs are assigned."""

    name: str  # model-stage name
    tp: int
    pp: int
    dp: int
    micro_batch: int  # sequences per micro-batch per replica
    grad_accum: int  # micro-batches per replica per update (training) or per step
    recompute: bool = False  # full activation recomputation (training)

    @property
    def replica_size(self) -> int:
        return self.tp * self.pp

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class StagePlan:
    """⟨tp, pp, dp, GPU set⟩ of one model-stage, plus its batch split.

    ``replicas[r][pp_rank * tp + tp_rank]`` is the global GPU id of that position of DP replica
    ``r`` (TP fastest, as in Megatron's rank order). Per replica, ``micro_batch`` sequences per
    micro-batch and ``grad_accum`` micro-batches per update, so that
    ``dp * micro_batch * grad_accum`` equals the sequences of one update (training) or of the step
    (generation and inference) — in the planner's uneven space (``PlanSpace.uneven_dp``)
    ``micro_batch * grad_accum`` is the largest replica's share ``⌈n/dp⌉`` instead (generation:
    rounds covering it, the last one possibly partial); `nereus run` plans only the former.
    """

    name: str
    tp: int
    pp: int
    dp: int
    micro_batch: int
    grad_accum: int
    recompute: bool = False
    replicas: tuple[tuple[int, ...], ...] = ()

    @property
    def replica_size(self) -> int:
        return self.tp * self.pp

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def candidate(self) -> Candidate:
        return Candidate(
            self.name, self.tp, self.pp, self.dp, self.micro_batch, self.grad_accum, self.recompute
        )

    @staticmethod
    def place(c: Candidate, replicas: tuple[tuple[int, ...], ...]) -> StagePlan:
        return StagePlan(
            c.name, c.tp, c.pp, c.dp, c.micro_batch, c.grad_accum, c.recompute, replicas
        )

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted({g for rep in self.replicas for g in rep}))

    def gpu_at(self, dp_rank: int, pp_rank: int, tp_rank: int) -> int:
        return self.replicas[dp_rank][pp_rank * self.tp + tp_rank]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "recompute": self.recompute,
            "replicas": [list(r) for r in self.replicas],
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> StagePlan:
        return StagePlan(
            name=str(d["name"]),
            tp=int(d["tp"]),
            pp=int(d["pp"]),
            dp=int(d["dp"]),
            micro_batch=int(d["micro_batch"]),
            grad_accum=int(d["grad_accum"]),
            recompute=bool(d.get("recompute", False)),
            replicas=tuple(tuple(int(g) for g in r) for r in d.get("replicas", ())),
        )


@dataclass(frozen=True)
class ExecutionPlan:
    stages: tuple[StagePlan, ...]

    def stage(self, name: str) -> StagePlan:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def to_dict(self) -> dict[str, Any]:
        return {"stages": [s.to_dict() for s in self.stages]}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ExecutionPlan:
        return ExecutionPlan(tuple(StagePlan.from_dict(s) for s in d["stages"]))
