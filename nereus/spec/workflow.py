"""RL workflow graphs: which model-stages a step runs, in which order, and on which GPUs.

A step is a set of *lanes* that run concurrently on disjoint GPUs; each lane is a sequence of
*phases* that run one after another (and may share GPUs); each phase is a set of model-stages that
run concurrently on disjoint GPUs. Synchronous PPO is one lane ``[gen] → [inf] → [train]``;
asynchronous execution overlaps generation with the rest: lanes ``[gen]`` and ``[inf] → [train]``,
with the step boundary at the weight synchronization.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from functools import cached_property, lru_cache


class Stage(str, Enum):
    GENERATION = "generation"
    INFERENCE = "inference"
    TRAINING = "training"

    @property
    def order(self) -> int:
        """gen → inf → train: the tie-breaking order of the transition DAG."""
        return {"generation": 0, "inference": 1, "training": 2}[self.value]


ALGORITHMS = ("ppo", "grpo", "remax")
MODES = ("sync", "async")
ROLES = ("actor", "critic", "reward", "reference")


@dataclass(frozen=True)
class ModelStage:
    """One model in one stage, e.g. ``actor-gen`` or ``critic-train``."""

    name: str
    role: str  # "actor" | "critic" | "reward" | "reference": which model (architecture)
    stage: Stage
    kind: str  # "generate" | "forward" | "train"
    state: str  # logical state this model-stage holds; actor-gen and actor-train share "actor"
    sequences_per_prompt: int = 1  # sequences it processes per prompt of the global batch

    @property
    def trainable(self) -> bool:
        return self.kind == "train"


@dataclass(frozen=True)
class Workflow:
    algorithm: str
    mode: str
    model_stages: tuple[ModelStage, ...]
    lanes: tuple[tuple[tuple[str, ...], ...], ...]  # lane → phase → model-stage names

    def by_name(self, name: str) -> ModelStage:
        for ms in self.model_stages:
            if ms.name == name:
                return ms
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(ms.name for ms in self.model_stages)

    def phases(self) -> tuple[tuple[str, ...], ...]:
        """Every phase of every lane; model-stages of one phase run concurrently."""
        return tuple(phase for lane in self.lanes for phase in lane)

    def lane_of(self, name: str) -> int:
        for i, lane in enumerate(self.lanes):
            if any(name in phase for phase in lane):
                return i
        raise KeyError(name)

    def concurrent(self, a: str, b: str) -> bool:
        """True when ``a`` and ``b`` run at the same time and so need disjoint GPUs."""
        got = self._concurrency.get((a, b))
        return self._concurrent(a, b) if got is None else got

    def _concurrent(self, a: str, b: str) -> bool:
        if a == b:
            return False
        if self.lane_of(a) != self.lane_of(b):
            return True
        return any(a in phase and b in phase for phase in self.phases())

    @cached_property
    def _concurrency(self) -> dict[tuple[str, str], bool]:
        """:meth:`concurrent` of every pair of the lanes' model-stages (asked per pair of
        model-stages each time a transition is planned)."""
        names = {m for phase in self.phases() for m in phase}
        return {(a, b): self._concurrent(a, b) for a in names for b in names}

    def shares_state(self, a: str, b: str) -> bool:
        return self.by_name(a).state == self.by_name(b).state

    def copy_source(self, name: str) -> str | None:
        """The trainable model-stage whose weights the frozen model-stage ``name`` holds a copy
        of after every step's weight sync (actor-gen: actor-train; critic-inf: critic-train),
        or None (a trainable model-stage, or a frozen one with a state of its own: reference,
        reward). A copy whose every replica is lost comes back from a replica of its source,
        as the runtime's recovery does (``nereus.runtime.failures.recovery``)."""
        ms = self.by_name(name)
        if ms.trainable:
            return None
        for other in self.model_stages:
            if other.trainable and other.state == ms.state:
                return other.name
        return None

    def lost_stages(self, replicas_alive: Mapping[str, bool]) -> list[str]:
        """The model-stages whose state is gone, given whether each has a replica alive: no
        replica alive, and no replica of its copy source (:meth:`copy_source`) either."""
        out = []
        for name, alive in replicas_alive.items():
            if alive:
                continue
            src = self.copy_source(name)
            if src is None or not replicas_alive.get(src, False):
                out.append(name)
        return sorted(out)

    def roles(self) -> tuple[str, ...]:
        seen: list[str] = []
        for ms in self.model_stages:
            if ms.role not in seen:
                seen.append(ms.role)
        return tuple(seen)


@lru_cache(maxsize=64)  # a frozen record: one per job shape (the planner asks for it often)
def build_workflow(
    algorithm: str,
    mode: str = "sync",
    *,
    reward_model: bool = True,
    samples_per_prompt: int = 1,
    actor_inf: bool = False,
) -> Workflow:
    """The model-stages and overlap graph of one RL algorithm.

    ``reward_model`` False means a rule-based reward (no reward-inf model-stage); ``actor_inf``
    adds a forward pass of the actor for old log-probs. GRPO samples ``samples_per_prompt``
    responses per prompt; ReMax adds a greedy baseline generation (two sequences per prompt in
    generation and reward inference).
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r} not in {ALGORITHMS}")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} not in {MODES}")
    n = samples_per_prompt
    gen_n = 2 * n if algorithm == "remax" else n
    gen = [ModelStage("actor-gen", "actor", Stage.GENERATION, "generate", "actor", gen_n)]
    inf: list[ModelStage] = []
    if actor_inf:
        inf.append(ModelStage("actor-inf", "actor", Stage.INFERENCE, "forward", "actor", n))
    inf.append(ModelStage("ref-inf", "reference", Stage.INFERENCE, "forward", "reference", n))
    if reward_model:
        inf.append(ModelStage("reward-inf", "reward", Stage.INFERENCE, "forward", "reward", gen_n))
    if algorithm == "ppo":
        inf.append(ModelStage("critic-inf", "critic", Stage.INFERENCE, "forward", "critic", n))
    train = [ModelStage("actor-train", "actor", Stage.TRAINING, "train", "actor", n)]
    if algorithm == "ppo":
        train.append(ModelStage("critic-train", "critic", Stage.TRAINING, "train", "critic", n))
    stages = tuple(gen + inf + train)
    phase_gen = tuple(ms.name for ms in gen)
    phase_inf = tuple(ms.name for ms in inf)
    phase_train = tuple(ms.name for ms in train)
    lanes: tuple[tuple[tuple[str, ...], ...], ...]
    if mode == "sync":
        lanes = ((phase_gen, phase_inf, phase_train),)
    else:
        lanes = ((phase_gen,), (phase_inf, phase_train))
    return Workflow(algorithm=algorithm, mode=mode, model_stages=stages, lanes=lanes)
