"""A host-staged plan change on the ranks (effectful; :mod:`nereus.transition.staged`).

Every rank runs the three legs of the :class:`~nereus.transition.staged.StagedTransition` rank 0
planned, in the same order:

1. **offload** — a rank holding a position of a staged model-stage's ``source`` replica copies
   that position's logical state (the parameters' logical values — fp32 masters under mixed
   precision — and Adam's moments, the counters and Adam's step) into host buffers (pinned
   where a CUDA device is there to copy from), then every unit of every staged model-stage is
   dropped and its device memory returned;
2. **DAG** — the rest of the model-stages change by :func:`nereus.runtime.execution.dag.run_dag`
   as any DAG does (the staged ones hold no device memory meanwhile);
3. **reload** — per staged model-stage, every rank creates the target units' groups (collective)
   and the per-tensor transfer plan from the source replica to the target units
   (:func:`nereus.emu.transfer.plan_transfer`, the same on every rank) runs with this rank's host
   part as the source: local slices copied host → device, the others sent over the host
   transport (gloo) into the new units (:meth:`TorchExecutor.from_host`); then the host parts
   are dropped.

Values are copied, never recomputed: the result is bit-exact with the source state (tested on 8
CPU ranks against a job that did not transition, ``tests/ranks/test_host_stage_gloo.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from nereus.emu.transfer import plan_transfer
from nereus.emu.unit import Emu
from nereus.errors import TransitionError
from nereus.runtime.execution.dag import DagRun, PrimitiveRun, run_dag
from nereus.runtime.execution.device import RankDevice
from nereus.runtime.execution.torch_executor import TorchExecutor
from nereus.runtime.worker.state import FIELDS, Counters, UnitState
from nereus.runtime.worker.units import release_units
from nereus.spec.job import Setup
from nereus.spec.model import ModelSpec
from nereus.transition.staged import StagedTransition


@dataclass
class HostShard:
    """This rank's position of a unit parked in host memory: per field (parameter, Adam's
    moments) and local key the tensor, the counters and Adam's step."""

    spec: ModelSpec
    emu: Emu
    global_rank: int
    fields: dict[str, dict[str, torch.Tensor]]
    counters: Counters
    step: float
    nbytes: int = 0

    def tensors(self) -> dict[str, dict[str, torch.Tensor]]:
        return self.fields

    def step_value(self) -> float:
        return self.step


def to_host(st: UnitState, nfields: int) -> HostShard:
    """A host copy of this rank's part of ``st`` (the ``nfields`` first of :data:`FIELDS`)."""
    pin = st.torch_device.type == "cuda"
    out: dict[str, dict[str, torch.Tensor]] = {}
    nbytes = 0
    with torch.no_grad():
        for f in FIELDS[:nfields]:
            out[f] = {}
            for key, t in st.tensors()[f].items():
                h = torch.empty(tuple(t.shape), dtype=t.dtype, pin_memory=pin)
                h.copy_(t)
                out[f][key] = h
                nbytes += h.numel() * h.element_size()
    return HostShard(st.spec, st.emu, st.global_rank, out, Counters(**vars(st.counters)),
                     st.step_value(), nbytes)


@dataclass
class StagedRun:
    """What one rank saw: the DAG leg's record, the bytes it parked in host memory, and the
    bytes the reload moved (exact, from the transfer plans)."""

    dag: DagRun
    host_bytes: int = 0
    reload_bytes: int = 0
    reloaded: list[Emu] = field(default_factory=list)


def run_staged(setup: Setup, staged: StagedTransition, held: dict[Emu, UnitState],
               global_rank: int, store: dist.Store, namespace: str, *, timeout_s: float,
               lr: float, device: RankDevice | None = None
               ) -> tuple[dict[Emu, UnitState], list[UnitState], StagedRun]:
    """Run the three legs on this rank (every rank calls it with the same ``staged``).

    ``held``: this rank's units of the running plan that are sources (of the rest's DAG or of
    a staged model-stage); the staged model-stages' units are taken out of it, their groups
    released and their memory returned in the offload leg (the caller keeps no other reference
    to them). Returns this rank's units of the target, the states the rest's DAG consumed
    (their groups are the caller's to release) and the run's record."""
    names = set(staged.names)
    wf = setup.job.workflow
    nfields = {n: len(FIELDS) if wf.by_name(n).trainable else 1 for n in names}
    host: dict[str, HostShard] = {}
    for h in staged.stages:  # 1. offload
        st = held.get(h.source)
        if st is not None:
            host[h.model_stage] = to_host(st, nfields[h.model_stage])
    if device is not None:
        device.synchronize()  # the host copies are complete before the devices' memory goes
    release_units([held.pop(e) for e in [e for e in held if e.model_stage in names]])
    if device is not None:
        device.release_memory()
    final, consumed, dag_run = run_dag(setup, staged.rest.dag, held, global_rank, store,
                                       f"{namespace}/rest", timeout_s=timeout_s, lr=lr,
                                       device=device)  # 2. the rest's DAG
    record = StagedRun(dag_run, sum(x.nbytes for x in host.values()))
    gpn = setup.cluster.gpus_per_node
    for k, h in enumerate(staged.stages):  # 3. reload, one model-stage after the other
        spec = setup.job.model(wf.by_name(h.model_stage).role)
        ex = TorchExecutor(spec, global_rank, store, f"{namespace}/reload/{h.model_stage}",
                           fields=nfields[h.model_stage], gpus_per_node=gpn,
                           timeout_s=timeout_s, lr=lr, device=device)
        plan = plan_transfer(spec, [h.source], list(h.targets), gpus_per_node=gpn,
                             fields=nfields[h.model_stage])
        made = ex.from_host(plan, host.pop(h.model_stage, None))
        for emu, st in zip(plan.targets, made, strict=True):
            if st is not None:
                final[emu] = st
        record.reload_bytes += plan.bytes_moved
        record.reloaded += list(h.targets)
        dag_run.primitives.append(PrimitiveRun(len(staged.rest.dag.primitives) + k, "reload",
                                               h.model_stage, dag_run.waves + 1 + k,
                                               plan.bytes_moved))
        for name, n in ex.transports.items():
            dag_run.transports[name] = dag_run.transports.get(name, 0) + n
    target = set(staged.rest.dag.target) | set(record.reloaded)
    stray = [e for e in final if e not in target]
    if stray:
        raise TransitionError(f"rank {global_rank}: the staged change ended with units not in "
                              f"the target: {stray[:3]}")
    return final, consumed, record
