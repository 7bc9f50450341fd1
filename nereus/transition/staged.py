"""Host-staged transitions: when device memory blocks every order of a DAG (pure; issue 32).

A DAG of EMU primitives keeps a model-stage's old layout until its new one is built from it
(Split keeps its source shard beside the gathered one; an Extend's sender keeps its shard), so
on a GPU that co-resident model-stages already fill, the old and the new layouts of a large
model-stage may not fit together at any instant, in any order: the compiler then raises. A
*staged* transition parks those model-stages' state in pinned host memory instead:

1. **offload** — for every staged model-stage, one replica (the ``source`` of its
   :class:`HostStage`; the one whose GPUs hold most of its target units) copies its shards to
   the pinned host memory of its own ranks; then every source unit of the model-stage is
   dropped from the devices (the other replicas are redundant copies: nothing is lost);
2. **DAG** — the model-stages not staged change by their ordinary DAG (``rest``), compiled and
   memory-checked without the staged ones, which hold no device memory meanwhile;
3. **reload** — every target unit of a staged model-stage is built from the host copy (each
   position's slices by the same per-tensor transfer plan as any primitive, over the host
   transport; local slices by a host→device copy), then the host copy is dropped.

So a staged model-stage frees its old layout before it builds the new one, reading the state
from one replica. Which model-stages are staged: those whose units change, the largest
per-GPU shards first, as few as make the rest compile (:func:`plan_staged`). Costs (seconds):
the offload at the host link (``GpuSpec.host_link_gbps``, per device, all at once), the rest's
L̂_tran, the reload over the host transport (``ClusterSpec.host_gbps`` per pair) plus the
host→device copy, a communicator and a build per staged model-stage. Host memory: the host
copy's shards per device within ``GpuSpec.host_memory_bytes``. :func:`staged_device_peaks`
replays the three legs (the DAG under the scheduler) and gives each GPU's highest device bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nereus.cost.calibration import Calibration
from nereus.emu.primitives import shard_bytes
from nereus.emu.unit import Emu, emus_of_plan
from nereus.errors import TransitionError
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan
from nereus.transition.cost import rates
from nereus.transition.dag import TransitionDag
from nereus.transition.graph import default_stage_rank
from nereus.transition.planned import (
    PlannedTransition,
    check_target_fits,
    device_capacity,
    job_sizers,
    plan_plans,
    plan_without,
    stage_states,
)
from nereus.transition.schedule import Scheduler, SimulatedExecutor, drive


@dataclass(frozen=True)
class HostStage:
    """One model-stage staged through host memory: ``source`` (a replica) is copied to the
    pinned host memory of its ranks, ``dropped`` (its other source units) are destroyed, and
    ``targets`` are built from the host copy."""

    model_stage: str
    source: Emu
    dropped: tuple[Emu, ...]
    targets: tuple[Emu, ...]
    state_bytes: int
    replicated_bytes: int = 0

    @property
    def shard_bytes(self) -> int:
        """Host bytes per GPU of the source replica."""
        return shard_bytes(self.state_bytes, self.source.layout, self.replicated_bytes)

    def unit_bytes(self, unit: Emu) -> int:
        return shard_bytes(self.state_bytes, unit.layout, self.replicated_bytes)


@dataclass(frozen=True)
class StagedTransition:
    """The three legs (module docstring): ``stages`` offloaded and reloaded, ``rest`` the DAG
    of the other model-stages in between; the legs' seconds, the pinned host bytes per GPU, and
    why the plain DAG did not do (``reason``)."""

    stages: tuple[HostStage, ...]
    rest: PlannedTransition
    offload_s: float
    reload_s: float
    host_bytes: tuple[tuple[int, int], ...]
    reason: str

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(h.model_stage for h in self.stages)


def plan_staged(setup: Setup, current: ExecutionPlan, target: ExecutionPlan,
                pool: Sequence[int] | None = None, calib: Calibration | None = None,
                reason: str = "") -> PlannedTransition:
    """The host-staged transition from the units of ``current`` alive on ``pool`` to
    ``target`` (module docstring), staging as few model-stages as make the rest compile;
    TransitionError when none does (or a staged copy does not fit host memory)."""
    wf = setup.job.workflow
    sizer, replicated = job_sizers(setup.job)
    states = stage_states(setup)
    alive = None if pool is None else set(pool)
    src = [u for u in emus_of_plan(current, states) if alive is None or alive.issuperset(u.gpus)]
    tgt = list(emus_of_plan(target, states))
    src_of: dict[str, list[Emu]] = {}
    tgt_of: dict[str, list[Emu]] = {}
    for u in src:
        src_of.setdefault(u.model_stage, []).append(u)
    for v in tgt:
        tgt_of.setdefault(v.model_stage, []).append(v)
    changed = [n for n in tgt_of if set(src_of.get(n, ())) != set(tgt_of[n])]
    lost = [n for n in changed if not src_of.get(n)]
    if lost:
        raise TransitionError(f"every replica of {', '.join(lost)} was lost")

    def pressure(n: str) -> tuple[int, int, str]:
        rep = replicated(n)
        top = max(shard_bytes(sizer(n), u.layout, rep) for u in src_of[n] + tgt_of[n])
        return (-top, default_stage_rank(n), n)

    changed.sort(key=pressure)
    cl = setup.cluster
    capacity = device_capacity(setup)
    last = reason
    for k in range(1, len(changed) + 1):
        names = changed[:k]
        stages, host = _host_stages(setup, names, src_of, tgt_of, sizer, replicated)
        if stages is None:
            last = host_reason(host)
            continue
        cur_rest, tgt_rest = plan_without(current, names), plan_without(target, names)
        try:
            if cur_rest.stages:
                rest = plan_plans(cur_rest, tgt_rest, states, sizer, cl,
                                  capacity_bytes=capacity, conflicts=wf.concurrent,
                                  replicated=replicated, alive=alive, calib=calib)
            else:
                empty = TransitionDag((), (), (), (), ())
                rest = PlannedTransition(rates(cl, calib).fixed_s, reference=empty)
        except TransitionError as e:
            last = str(e)
            continue
        check_target_fits(setup, target, capacity)
        offload_s, reload_s = _legs_s(setup, stages)
        r = rates(cl, calib)
        cost = rest.cost_s + offload_s + reload_s + len(stages) * (r.setup_s + r.build_s)
        return PlannedTransition(cost, staged=StagedTransition(
            tuple(stages), rest, offload_s, reload_s, tuple(sorted(host.items())),
            reason or "the DAG does not fit device memory"))
    raise TransitionError(f"{reason}; staging through host memory did not help either: {last}"
                          if reason else f"staging through host memory did not help: {last}")


def host_reason(host: dict[int, int]) -> str:
    g = min(host)
    return f"the staged shards exceed GPU {g}'s pinned host memory ({host[g]} bytes)"


def _host_stages(setup: Setup, names: Sequence[str], src_of: Mapping[str, list[Emu]],
                 tgt_of: Mapping[str, list[Emu]], sizer: object, replicated: object
                 ) -> tuple[list[HostStage] | None, dict[int, int]]:
    """Per staged model-stage the replica to offload (most target GPUs of its own first, then
    the lowest GPUs) within every GPU's pinned host memory; (None, {GPU: bytes it would need})
    when some model-stage's every replica overflows one."""
    cl = setup.cluster
    host: dict[int, int] = {}
    out: list[HostStage] = []
    for n in names:
        state, rep = sizer(n), replicated(n)  # type: ignore[operator]
        want = {g for v in tgt_of[n] for g in v.gpus}
        best: HostStage | None = None
        need: dict[int, int] = {}
        for u in sorted(src_of[n], key=lambda u: (-len(want.intersection(u.gpus)), u.gpus)):
            b = shard_bytes(state, u.layout, rep)
            over = {g: host.get(g, 0) + b for g in u.gpus
                    if host.get(g, 0) + b > cl.gpu_of(g).host_memory_bytes}
            if not over:
                best = HostStage(n, u, tuple(x for x in src_of[n] if x != u),
                                 tuple(tgt_of[n]), state, rep)
                break
            need = need or over
        if best is None:
            return None, need
        for g in best.source.gpus:
            host[g] = host.get(g, 0) + best.shard_bytes
        out.append(best)
    return out, host


def _legs_s(setup: Setup, stages: Sequence[HostStage]) -> tuple[float, float]:
    """(offload, reload) seconds: every GPU's bytes to host at its host link, all at once; the
    reload's busiest GPU — a source sends each target unit its shard over the host transport,
    a target receives its shard and copies it to the device."""
    cl = setup.cluster
    host_bps = cl.host_gbps * 1e9
    down: dict[int, float] = {}
    send: dict[int, float] = {}
    recv: dict[int, float] = {}
    for h in stages:
        sb = h.shard_bytes
        for g in h.source.gpus:
            down[g] = down.get(g, 0.0) + sb / (cl.gpu_of(g).host_link_gbps * 1e9)
            send[g] = send.get(g, 0.0) + len(h.targets) * sb / host_bps
        for v in h.targets:
            tb = h.unit_bytes(v)
            for g in v.gpus:
                recv[g] = recv.get(g, 0.0) + tb / host_bps \
                    + tb / (cl.gpu_of(g).host_link_gbps * 1e9)
    offload = max(down.values(), default=0.0)
    reload = max([*send.values(), *recv.values(), 0.0])
    return offload, reload


def staged_device_peaks(planned: PlannedTransition,
                        capacity_bytes: int | Mapping[int, int] | None = None
                        ) -> dict[int, int]:
    """Each GPU's highest device bytes over the three legs of a staged transition: the source
    units while the offload copies out; the rest's DAG run by the scheduler (its live units
    and running primitives' buffers, under ``capacity_bytes`` as the ranks run it); the target
    units as the reload fills them."""
    st = planned.staged
    if st is None:
        raise TransitionError("not a staged transition")
    dag = st.rest.dag
    peak: dict[int, int] = {}

    def raise_to(per_gpu: Mapping[int, int]) -> None:
        for g, b in per_gpu.items():
            if b > peak.get(g, 0):
                peak[g] = b

    def on_gpus(units: Sequence[tuple[Emu, int]]) -> dict[int, int]:
        out: dict[int, int] = {}
        for u, b in units:
            for g in u.gpus:
                out[g] = out.get(g, 0) + b
        return out

    staged_src = [(u, h.unit_bytes(u)) for h in st.stages for u in (h.source, *h.dropped)]
    rest_src = [(u, dag.unit_bytes(u)) for u in dag.source]
    raise_to(on_gpus(staged_src + rest_src))  # leg 1
    sched = Scheduler(dag, capacity_bytes=capacity_bytes)
    drive(sched, _Recording(sched, peak))  # leg 2
    rest_tgt = [(u, dag.unit_bytes(u)) for u in dag.target]
    staged_tgt = [(v, h.unit_bytes(v)) for h in st.stages for v in h.targets]
    raise_to(on_gpus(rest_tgt + staged_tgt))  # leg 3: the end state
    return peak


class _Recording(SimulatedExecutor):
    """A unit-time executor that raises ``peak`` to the scheduler's bytes after every start."""

    def __init__(self, sched: Scheduler, peak: dict[int, int]) -> None:
        super().__init__([1.0] * len(sched.dag.primitives))
        self.sched = sched
        self.peak = peak

    def start(self, index: int, primitive: object) -> None:
        super().start(index, primitive)  # type: ignore[arg-type]
        for g, b in self.sched.bytes_now.items():
            if b > self.peak.get(g, 0):
                self.peak[g] = b
