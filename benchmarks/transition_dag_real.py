"""Overlap trials executed for real: transition DAGs vs per-component migration on 8 CPU ranks.

Mode "real" of benchmarks/transition_dag.py part (b). 8 MPI ranks (2 virtual nodes x 4), each
a CPU "GPU" under gloo; every model-stage is a tiny-gpt Megatron-core GPTModel (scaled down
from the simulated 32/48-GPU cases: same three overlap types, GPU counts scaled to 8). Per trial
rank 0 draws random placements of the current and target plans (TP groups inside a node; model-
stages on disjoint GPUs, as in the simulated mode, so a model-stage grows only onto GPUs another
one released; a target the compiler reports infeasible is redrawn and counted), a launch offset per model-stage
(uniform 0…LAUNCH_JITTER_S) and broadcasts the DAG; then, on fresh source units each time:
- ours: every rank drives the shared scheduler over the DAG (nereus.runtime.execution.dag) with real
  transfers; a wave waits for the launch offsets of its model-stages. Afterwards every rank
  checks its target units' shards against the source state bit for bit.
- per-component (DynaRL-style): each model-stage runs its own local DAG (no resource edges) in
  a random order of its own from its launch time; an Extend grabs its target GPUs one by one as
  they are free of conflicting model-stages and holds them while it waits for the rest. Rank 0
  issues the primitives in real time as the components would, every rank executes them for real
  (one at a time: collective group creation keeps ranks in lock-step, so components do not
  overlap — this only lengthens the baseline's time). When every launched component waits on
  GPUs another holds, nothing can ever move: the trial is a deadlock, counted at the timeout.

    python benchmarks/transition_dag_real.py [--json] [--trials N]   (launches mpiexec -n 8)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Any

WORLD, GPN = 8, 4
TIMEOUT_S = 60.0
LAUNCH_JITTER_S = 0.5
# (name, [(model-stage, GPUs, tp, pp) current], [... target]) on 8 CPU ranks
OVERLAPS = (
    ("same-model cross-stage",
     (("actor-gen", 4, 2, 1), ("actor-train", 4, 2, 2)),
     (("actor-gen", 2, 1, 1), ("actor-train", 6, 2, 1))),
    ("cross-model same-stage",
     (("ref-inf", 2, 1, 1), ("reward-inf", 2, 2, 1), ("critic-inf", 4, 2, 2)),
     (("ref-inf", 2, 2, 1), ("reward-inf", 4, 1, 1), ("critic-inf", 2, 2, 1))),
    ("cross-model cross-stage",
     (("actor-gen", 2, 2, 1), ("reward-inf", 2, 1, 1), ("critic-train", 4, 2, 2)),
     (("actor-gen", 4, 1, 1), ("reward-inf", 2, 2, 1), ("critic-train", 2, 2, 1))),
)


def _setup() -> Any:
    from nereus.spec.hardware import CPU_VIRTUAL, ClusterSpec
    from nereus.spec.job import JobSpec, Setup
    from nereus.spec.model import TINY_GPT

    job = JobSpec("ppo", "sync", tuple((r, TINY_GPT) for r in ("actor", "critic", "reference",
                                                               "reward")),
                  global_batch=8, prompt_len=8, gen_len=8, reward_model=True)
    return Setup(job, ClusterSpec(WORLD // GPN, GPN, CPU_VIRTUAL))


def _random_units(rng: random.Random, spec: tuple[tuple[str, int, int, int], ...]) -> tuple:
    """Random placement, every pipeline stage's TP group inside one node."""
    from nereus.emu.unit import Emu, Layout

    free = {node: rng.sample(range(node * GPN, (node + 1) * GPN), GPN)
            for node in range(WORLD // GPN)}
    groups = [(tp, k, r, s) for k, (_, size, tp, pp) in enumerate(spec)
              for r in range(size // (tp * pp)) for s in range(pp)]
    rng.shuffle(groups)
    groups.sort(key=lambda g: -g[0])
    placed: dict[tuple[int, int, int], list[int]] = {}
    for tp, k, r, s in groups:
        node = rng.choice([nd for nd, g in free.items() if len(g) >= tp])
        placed[(k, r, s)] = sorted(free[node][:tp])
        del free[node][:tp]
    return tuple(Emu(name, name, Layout(tp, pp), tuple(g for s in range(pp)
                                                        for g in placed[(k, r, s)]))
                 for k, (name, size, tp, pp) in enumerate(spec)
                 for r in range(size // (tp * pp)))


def _draw(setup: Any, rng: random.Random, cur: Any, tgt: Any) -> tuple[Any, int]:
    from nereus.emu.primitives import model_state_sizer
    from nereus.errors import InfeasiblePlanError, TransitionError
    from nereus.transition.reference.compile import compile_transition

    wf = setup.job.workflow
    sizer = model_state_sizer({ms.name: setup.job.model(ms.role) for ms in wf.model_stages},
                              {ms.name: ms.trainable for ms in wf.model_stages},
                              setup.job.dtype_bytes)
    redrawn = 0
    while True:
        try:
            # Disjoint placements (the default conflict relation), as in the simulated mode:
            # a model-stage can only grow onto GPUs another one has released. With the
            # workflow's own relation (stages of different phases may share GPUs) these
            # 8-GPU cases need no hand-over at all.
            return compile_transition(_random_units(rng, cur), _random_units(rng, tgt), sizer,
                                      capacity_bytes=setup.cluster.gpu.memory_bytes), redrawn
        except (TransitionError, InfeasiblePlanError):
            redrawn += 1


@functools.lru_cache(maxsize=16)
def _global(spec: Any, seed: int) -> dict[str, dict[str, Any]]:
    """The logical state of a model-stage (the same arrays for every unit and trial: read
    only)."""
    import numpy as np

    from nereus.emu.shards import tensor_specs

    rng = np.random.default_rng(seed)
    return {f: {t.name: (rng.standard_normal(t.global_shape) * 0.05).astype(np.float32)
                for t in tensor_specs(spec)} for f in ("param", "exp_avg", "exp_avg_sq")}


def _sources(setup: Any, dag: Any, rank: int) -> dict[Any, Any]:
    from nereus.runtime.execution.groups import unit_groups
    from nereus.runtime.worker.state import load_global, new_unit_state

    held = {}
    names = sorted({u.model_stage for u in dag.source})
    for emu in dag.source:
        groups = unit_groups(emu, rank, TIMEOUT_S)
        if groups is None:
            continue
        spec = setup.job.model(setup.job.workflow.by_name(emu.model_stage).role)
        st = new_unit_state(spec, emu, rank, groups, initialize=False)
        load_global(st, _global(spec, names.index(emu.model_stage)))
        held[emu] = st
    return held


def _exact(setup: Any, dag: Any, final: dict[Any, Any]) -> bool:
    """This rank's target shards equal the source state (params; Adam too when trainable)."""
    import numpy as np

    names = sorted({u.model_stage for u in dag.source})
    for emu, st in final.items():
        ms = setup.job.workflow.by_name(emu.model_stage)
        want = _global(st.spec, names.index(emu.model_stage))
        live = st.tensors()
        for s in st.shards():
            for f in (("param", "exp_avg", "exp_avg_sq") if ms.trainable else ("param",)):
                for pc in s.pieces:
                    g = tuple(slice(a, b) for a, b in zip(pc.global_.start, pc.global_.stop,
                                                          strict=True))
                    lo = tuple(slice(a, b) for a, b in zip(pc.local.start, pc.local.stop,
                                                           strict=True))
                    if not np.array_equal(live[f][s.local_key][lo].numpy(), want[f][s.tensor][g]):
                        return False
    return True


def _ours(setup: Any, dag: Any, launch: dict[str, float], comm: Any, store: Any,
          ns: str) -> tuple[bool, float]:
    import torch.distributed as dist

    from nereus.runtime.execution.dag import RankDagExecutor
    from nereus.runtime.worker.units import release_units
    from nereus.transition.schedule import Scheduler, drive

    rank = comm.Get_rank()
    held = _sources(setup, dag, rank)
    comm.Barrier()
    t0 = time.perf_counter()

    class Gated(RankDagExecutor):
        def wait(self) -> Any:
            gate = max(launch[p.model_stage] for _, p in self._queued)
            time.sleep(max(0.0, t0 + gate - time.perf_counter()))
            return super().wait()

    ex = Gated(setup, dag, held, rank, store, ns, timeout_s=TIMEOUT_S, lr=1e-3)
    drive(Scheduler(dag, capacity_bytes=setup.cluster.gpu.memory_bytes), ex)
    elapsed = comm.allreduce(time.perf_counter() - t0, op=_mpi_max())
    final = ex.held()
    ok = comm.allreduce(int(set(final) <= set(dag.target) and _exact(setup, dag, final)))
    release_units(list(final.values()) + ex.dropped)
    dist.barrier()
    return ok == comm.Get_size(), elapsed


def _mpi_max() -> Any:
    from mpi4py import MPI

    return MPI.MAX


class _Components:
    """Rank 0's view of the per-component controllers (hold-and-wait GPU grabbing)."""

    def __init__(self, dag: Any, launch: dict[str, float], rng: random.Random) -> None:
        prims = dag.primitives
        local: list[set[int]] = [set() for _ in prims]
        for a, b, kind in dag.edges:
            if kind != "resource" and prims[a].model_stage == prims[b].model_stage:
                local[b].add(a)
        self.order: dict[str, list[int]] = {}
        for m in sorted({p.model_stage for p in prims}):
            left = {i for i, p in enumerate(prims) if p.model_stage == m}
            seq = []
            while left:
                pick = rng.choice(sorted(i for i in left if not (local[i] & left)))
                seq.append(pick)
                left.discard(pick)
            self.order[m] = seq
        self.dag, self.launch = dag, launch
        self.pos = dict.fromkeys(self.order, 0)
        self.owners: dict[int, set[str]] = {}
        for u in dag.source:
            for g in u.gpus:
                self.owners.setdefault(g, set()).add(u.model_stage)

    def _grab(self, g: int, m: str) -> bool:
        here = self.owners.setdefault(g, set())
        if any(self.dag.exclusion.conflicts(m, x) for x in here):
            return m in here
        here.add(m)
        return True

    def next(self, now_s: float) -> tuple[str, float]:
        """("start", i) | ("sleep", seconds) | ("done", 0) | ("deadlock", 0)."""
        from nereus.emu.primitives import Extend

        later = [self.launch[m] for m in self.order
                 if self.pos[m] < len(self.order[m]) and self.launch[m] > now_s]
        for m in sorted(self.order, key=lambda m: (self.launch[m], m)):
            if self.launch[m] > now_s or self.pos[m] >= len(self.order[m]):
                continue
            i = self.order[m][self.pos[m]]
            p = self.dag.primitives[i]
            if isinstance(p, Extend) and not all([self._grab(g, m) for g in p.new.gpus]):
                continue  # holds what it grabbed, waits for the rest
            self.pos[m] += 1
            return "start", float(i)
        if all(self.pos[m] >= len(s) for m, s in self.order.items()):
            return "done", 0.0
        if later:
            return "sleep", min(later) - now_s
        return "deadlock", 0.0

    def finished(self, i: int) -> None:
        from nereus.emu.primitives import Destroy, produced

        p = self.dag.primitives[i]
        if isinstance(p, Destroy):
            for g in p.unit.gpus:
                self.owners[g].discard(p.model_stage)
        for u in produced(p):
            for g in u.gpus:
                self.owners.setdefault(g, set()).add(u.model_stage)


def _baseline(setup: Any, dag: Any, launch: dict[str, float], seed: int, comm: Any,
              store: Any, ns: str) -> tuple[bool, float]:
    import torch.distributed as dist

    from nereus.runtime.execution.dag import RankDagExecutor
    from nereus.runtime.worker.units import release_units

    rank = comm.Get_rank()
    held = _sources(setup, dag, rank)
    comps = _Components(dag, launch, random.Random(seed)) if rank == 0 else None
    ex = RankDagExecutor(setup, dag, held, rank, store, ns, timeout_s=TIMEOUT_S, lr=1e-3)
    comm.Barrier()
    t0 = time.perf_counter()
    while True:
        decision = None
        if comps is not None:
            decision = comps.next(time.perf_counter() - t0)
        what, value = comm.bcast(decision, root=0)
        if what == "sleep":
            time.sleep(value)
            continue
        if what != "start":
            break
        i = int(value)
        ex.start(i, dag.primitives[i])
        ex.wait()
        if comps is not None:
            comps.finished(i)
        if time.perf_counter() - t0 > TIMEOUT_S:
            what = "timeout"
            break
    elapsed = comm.allreduce(time.perf_counter() - t0, op=_mpi_max())
    release_units(list(ex.held().values()) + ex.dropped)
    dist.barrier()
    if what == "done":
        return True, elapsed
    return False, TIMEOUT_S


def _worker(trials: int, seed: int, out_path: str) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    from nereus.runtime.mpi.plane import ControlPlane
    from nereus.runtime.mpi.rendezvous import StoreFolder, finish, rendezvous
    from nereus.transition.wire import dag_from_wire, dag_to_wire

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    folder = StoreFolder()
    rendezvous(ControlPlane(comm), folder, 0, timeout_s=TIMEOUT_S)
    store = dist.distributed_c10d._get_default_store()
    setup = _setup()
    rows = []
    for k, (name, cur, tgt) in enumerate(OVERLAPS):
        rng = random.Random(seed + k)
        ours_ok = base_ok = redrawn = 0
        ours_t: list[float] = []
        base_t: list[float] = []
        edges: list[int] = []
        for t in range(trials):
            msg = None
            if comm.Get_rank() == 0:
                dag, r = _draw(setup, rng, cur, tgt)
                redrawn += r
                launch = {m: rng.uniform(0, LAUNCH_JITTER_S)
                          for m in sorted({u.model_stage for u in dag.source})}
                msg = (dag_to_wire(dag), launch, rng.randrange(2**31))
            wire, launch, bseed = comm.bcast(msg, root=0)
            dag = dag_from_wire(wire)
            ok, s = _ours(setup, dag, launch, comm, store, f"o{k}.{t}")
            ours_ok += ok
            ours_t.append(s if ok else TIMEOUT_S)
            ok, s = _baseline(setup, dag, launch, bseed, comm, store, f"b{k}.{t}")
            base_ok += ok
            base_t.append(s)
            edges.append(len(dag.resource_edges))
        rows.append({"type": name, "mode": "real", "gpus": WORLD, "trials": trials,
                     "ours_success_pct": round(100 * ours_ok / trials, 1),
                     "baseline_success_pct": round(100 * base_ok / trials, 1),
                     "ours_s": round(statistics.mean(ours_t), 3),
                     "baseline_s": round(statistics.mean(base_t), 3),
                     "edges": round(statistics.mean(edges), 2), "redrawn": redrawn})
    if comm.Get_rank() == 0:
        with open(out_path, "w", encoding="utf-8") as fh:
            json.dump(rows, fh)
    dist.destroy_process_group()
    finish(comm, folder, comm.Get_rank() == 0)
    return 0


def real_rows(trials: int, seed: int = 20261201) -> list[dict[str, Any]]:
    """Launch the 8 ranks and return their rows."""
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    from launchers.commands import LaunchSpec, mpiexec_argv

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        argv = mpiexec_argv(LaunchSpec((sys.executable, os.path.abspath(__file__), "--worker",
                                        "--trials", str(trials), "--seed", str(seed),
                                        "--out", out), ntasks=WORLD))
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        res = subprocess.run(argv, env=env, cwd=root, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"real overlap ranks failed:\n{res.stderr[-3000:]}")
        with open(out, encoding="utf-8") as fh:
            rows: list[dict[str, Any]] = json.load(fh)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return _worker(args.trials, args.seed, args.out)
    rows = real_rows(args.trials, args.seed)
    if args.json:
        print(json.dumps({"overlap": rows}, indent=1))
        return 0
    print(f"{'overlap type':<26} {'mode':>4} {'ours %':>7} {'base %':>7} {'ours s':>7} "
          f"{'base s':>7} {'edges':>6} {'redrawn':>8}")
    for r in rows:
        print(f"{r['type']:<26} {r['mode']:>4} {r['ours_success_pct']:>7} "
              f"{r['baseline_success_pct']:>7} {r['ours_s']:>7} {r['baseline_s']:>7} "
              f"{r['edges']:>6} {r['redrawn']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
