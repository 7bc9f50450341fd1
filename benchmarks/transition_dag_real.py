"""Overlap trials executed for real: transition DAGs vs per-component migration on 8 CPU ranks.

Mode "real" of benchmarks/transition_dag.py part (b). 8 MPI ranks (2 virtual nodes x 4), each
a CPU "GPU" under gloo; every model-stage is a tiny-gpt Megatron-core GPTModel (scaled down
from the simulated 32/48-GPU cases: same three overlap types, GPU counts scaled to 8). Per trial
rank 0 draws random placements of the current and target plans (TP groups inside a node; model-
stages on disjoint GPUs, as in the simulated mode, so a model-stage grows only onto GPUs another
one released) and a launch offset per model-stage (uniform 0…LAUNCH_JITTER_S), without
consulting our compiler: a target it rejects is our failure unless an exhaustive search of a
relaxation proves that no transition exists (then it is excluded from both and counted). Then,
on fresh source units each time:
- ours: every rank drives the shared scheduler over our DAG (nereus.runtime.execution.dag) with
  real transfers; a wave waits for the launch offsets of its model-stages. Afterwards every rank
  checks its target units' shards against the source state bit for bit.
- per-component (DynaRL-style): each model-stage plans its migration alone
  (``per_component_dag``) and its controller, on its own leader rank, issues its primitives in a
  random order of its own local DAG from its launch time. An Extend's target ranks grant their
  GPU only while they hold no unit of a conflicting model-stage and are not promised to another
  component, and stay promised while the component waits for the rest (hold-and-wait). A
  controller that has waited ``WAIT_S`` for its GPUs gives up: deadlocks are observed as that
  time-out on the ranks (see ``_baseline``), not predicted.

The ranks' control messages (the trial, the baseline's requests and grants, the reductions)
travel as framed plain data over buffer-based MPI calls (``nereus.runtime.mpi.frames``): nothing
received is unpickled.

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
COMM_TIMEOUT_S = 60.0  # the ranks' communication time-out (ours and the baseline's transfers)
WAIT_S = 10.0  # a per-component controller gives up after waiting this long for its GPUs
TIMEOUT_S = WAIT_S  # a failed trial counts this many seconds in the mean times (both methods)
TICK_S = 0.005  # the baseline's ranks sleep this long between ticks where nothing ran
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


def _sizer(setup: Any) -> Any:
    from nereus.emu.primitives import model_state_sizer

    wf = setup.job.workflow
    return model_state_sizer({ms.name: setup.job.model(ms.role) for ms in wf.model_stages},
                             {ms.name: ms.trainable for ms in wf.model_stages},
                             setup.job.dtype_bytes)


def _draw(setup: Any, rng: random.Random, cur: Any, tgt: Any) -> Any:
    """One target drawn without consulting our compiler, planned by both methods (see
    ``transition_dag.draw_trial``). Disjoint placements (the default conflict relation), as in
    the simulated mode: a model-stage can only grow onto GPUs another one has released (with
    the workflow's own relation these 8-GPU cases need no hand-over at all)."""
    from transition_dag import draw_trial

    return draw_trial(_random_units(rng, cur), _random_units(rng, tgt), _sizer(setup),
                      setup.cluster.gpu.memory_bytes, range(WORLD))


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
        groups = unit_groups(emu, rank, COMM_TIMEOUT_S)
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

    ex = Gated(setup, dag, held, rank, store, ns, timeout_s=COMM_TIMEOUT_S, lr=1e-3)
    drive(Scheduler(dag, capacity_bytes=setup.cluster.gpu.memory_bytes), ex)
    elapsed = _reduce(comm, time.perf_counter() - t0, "max")
    final = ex.held()
    ok = int(_reduce(comm, float(set(final) <= set(dag.target) and _exact(setup, dag, final)),
                     "sum"))
    release_units(list(final.values()) + ex.dropped)
    dist.barrier()
    return ok == comm.Get_size(), elapsed


def _reduce(comm: Any, value: float, op: str) -> float:
    """``value`` reduced over the ranks (``"max"`` or ``"sum"``) with a buffer-based
    MPI_Allreduce of one float64 (nothing pickled)."""
    import numpy as np
    from mpi4py import MPI

    out = np.zeros(1)
    comm.Allreduce(np.array([value], dtype=np.float64), out,
                   op={"max": MPI.MAX, "sum": MPI.SUM}[op])
    return float(out[0])


def _linear_extension(dag: Any, m: str, rng: random.Random) -> list[int]:
    """A random order of model-stage ``m``'s primitives that keeps its local DAG."""
    prims = dag.primitives
    local: dict[int, set[int]] = {i: set() for i, p in enumerate(prims) if p.model_stage == m}
    for a, b, _ in dag.edges:
        if b in local and a in local:
            local[b].add(a)
    left, seq = set(local), []
    while left:
        pick = rng.choice(sorted(i for i in left if not (local[i] & left)))
        seq.append(pick)
        left.discard(pick)
    return seq


def _baseline(setup: Any, dag: Any, launch: dict[str, float], seed: int, comm: Any,
              store: Any, ns: str) -> tuple[bool, float, float]:
    """Per-component migration executed on the ranks: (success, seconds, longest wait).

    Each model-stage's controller runs on its *leader* (the lowest rank of its source units)
    and issues its own primitives in a random order of its own local DAG from its launch time;
    nobody sees the whole transition. An Extend asks every target rank for its GPU: a rank
    grants it only while it holds no unit of a conflicting model-stage (its real units) and is
    not promised to another component, and stays promised (hold-and-wait) until the Extend runs.
    The ranks meet in ticks (two allgathers of these requests and answers) because creating a
    unit's process groups is collective over the job on this CPU runtime; every primitive
    granted in a tick runs on every rank in the same order. A controller that has waited
    ``WAIT_S`` of wall time for its GPUs gives up: a deadlock is what that time-out observes.
    """
    import torch.distributed as dist

    from nereus.emu.primitives import Extend
    from nereus.runtime.execution.dag import RankDagExecutor
    from nereus.runtime.mpi import frames
    from nereus.runtime.worker.units import release_units

    rank = comm.Get_rank()
    prims, excl = dag.primitives, dag.exclusion
    held = _sources(setup, dag, rank)
    ex = RankDagExecutor(setup, dag, held, rank, store, ns, timeout_s=COMM_TIMEOUT_S, lr=1e-3)
    names = sorted({p.model_stage for p in prims})
    leader = {m: min(g for u in dag.source if u.model_stage == m for g in u.gpus)
              for m in names}
    mine = [m for m in names if leader[m] == rank]
    order = {m: _linear_extension(dag, m, random.Random(f"{seed}/{m}")) for m in mine}
    pos = dict.fromkeys(mine, 0)
    since: dict[str, float] = {}  # component → when it began waiting for its current primitive
    longest = 0.0
    promised: str | None = None  # this rank's GPU, promised to a waiting component
    comm.Barrier()
    t0 = time.perf_counter()
    outcome = ""
    while not outcome:
        now = time.perf_counter() - t0
        ask: dict[str, int] = {}
        state: dict[str, str] = {}
        for m in mine:
            if pos[m] >= len(order[m]):
                state[m] = "done"
            elif m in since and now - since[m] > WAIT_S:
                state[m] = "timeout"
            elif now >= launch[m]:
                ask[m] = order[m][pos[m]]
        gathered = frames.allgather(comm, [ask, state], "overlap-ask")
        asks = {m: i for a, _ in gathered for m, i in a.items()}
        states = {m: v for _, st in gathered for m, v in st.items()}
        if "timeout" in states.values():
            outcome = "timeout"
            break
        if len(states) == len(names):
            outcome = "done"
            break
        here = {e.model_stage for e in ex.held()}
        grants: dict[str, bool] = {}
        for m in sorted(asks, key=lambda m: (launch[m], m)):
            p = prims[asks[m]]
            if isinstance(p, Extend) and rank in p.new.gpus:
                ok = promised in (None, m) and not any(excl.exclusive(m, x) for x in here)
                if ok:
                    promised = m
                grants[m] = ok
        refused = {m for g in frames.allgather(comm, grants, "overlap-grant")
                   for m, ok in g.items() if not ok}
        run = sorted((i, m) for m, i in asks.items() if m not in refused)
        for i, m in run:
            ex.start(i, prims[i])
            ex.wait()
            if isinstance(prims[i], Extend) and rank in prims[i].new.gpus:
                promised = None
            if m in pos:
                pos[m] += 1
                if m in since:
                    longest = max(longest, time.perf_counter() - t0 - since.pop(m))
        for m in mine:
            if m in asks and m in refused:
                since.setdefault(m, now)
        if not run:
            time.sleep(TICK_S)
    elapsed = _reduce(comm, time.perf_counter() - t0, "max")
    longest = _reduce(comm, longest, "max")
    release_units(list(ex.held().values()) + ex.dropped)
    dist.barrier()
    if outcome == "done":
        return True, elapsed, longest
    return False, elapsed, longest


def _worker(trials: int, seed: int, out_path: str) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    from nereus.runtime.mpi import frames
    from nereus.runtime.mpi.plane import ControlPlane
    from nereus.runtime.mpi.rendezvous import StoreFolder, finish, rendezvous
    from nereus.transition.wire import dag_from_wire, dag_to_wire

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    folder = StoreFolder()
    rendezvous(ControlPlane(comm), folder, 0, timeout_s=COMM_TIMEOUT_S)
    store = dist.distributed_c10d._get_default_store()
    setup = _setup()
    rows = []
    for k, (name, cur, tgt) in enumerate(OVERLAPS):
        rng = random.Random(seed + k)
        ours_ok = base_ok = excluded = rejected = unplanned = verified = 0
        ours_t: list[float] = []
        base_t: list[float] = []
        base_fail_t: list[float] = []
        edges: list[int] = []
        waits: list[float] = []
        for t in range(trials):
            msg = None
            if comm.Get_rank() == 0:
                trial = _draw(setup, rng, cur, tgt)
                planned = trial.dag if trial.dag is not None else trial.pc_dag
                launch = {} if planned is None else {
                    m: rng.uniform(0, LAUNCH_JITTER_S)
                    for m in sorted({u.model_stage for u in planned.source})}
                msg = [trial.infeasible,
                       None if trial.dag is None else dag_to_wire(trial.dag),
                       None if trial.pc_dag is None else dag_to_wire(trial.pc_dag),
                       launch, rng.randrange(2**31)]
            infeasible, wire, pc_wire, launch, bseed = frames.bcast(comm, msg, 0, "overlap-trial")
            if infeasible:
                excluded += 1
                continue
            if wire is None:
                rejected += 1
                ours_t.append(TIMEOUT_S)
            else:
                dag = dag_from_wire(wire)
                ok, s = _ours(setup, dag, launch, comm, store, f"o{k}.{t}")
                ours_ok += ok
                verified += ok
                ours_t.append(s if ok else TIMEOUT_S)
                edges.append(len(dag.resource_edges))
            if pc_wire is None:
                unplanned += 1
                base_t.append(TIMEOUT_S)
                continue
            ok, s, wait = _baseline(setup, dag_from_wire(pc_wire), launch, bseed, comm, store,
                                    f"b{k}.{t}")
            base_ok += ok
            base_t.append(s if ok else TIMEOUT_S)
            if ok:
                waits.append(wait)
            else:
                base_fail_t.append(s)
        ran = trials - excluded
        rows.append({"type": name, "mode": "real", "gpus": WORLD, "trials": trials,
                     "excluded": excluded, "ours_rejected": rejected,
                     "baseline_unplanned": unplanned,
                     "ours_success_pct": round(100 * ours_ok / ran, 1) if ran else None,
                     "baseline_success_pct": round(100 * base_ok / ran, 1) if ran else None,
                     "ours_s": round(statistics.mean(ours_t), 3) if ours_t else None,
                     "baseline_s": round(statistics.mean(base_t), 3) if base_t else None,
                     "edges": round(statistics.mean(edges), 2) if edges else None,
                     "ours_verified": verified,
                     "baseline_longest_wait_ok_s": round(max(waits), 3) if waits else None,
                     "baseline_timeout_after_s": round(statistics.mean(base_fail_t), 3)
                     if base_fail_t else None})
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
    print(f"{'overlap type':<26} {'mode':>4} {'trials':>6} {'excl.':>5} {'ours %':>7} "
          f"{'base %':>7} {'ours s':>7} {'base s':>7} {'edges':>6} {'rejected':>8} "
          f"{'unplanned':>9} {'verified':>8} {'wait ok s':>9}")
    for r in rows:
        print(f"{r['type']:<26} {r['mode']:>4} {r['trials']:>6} {r['excluded']:>5} "
              f"{r['ours_success_pct']!s:>7} {r['baseline_success_pct']!s:>7} "
              f"{r['ours_s']!s:>7} {r['baseline_s']!s:>7} {r['edges']!s:>6} "
              f"{r['ours_rejected']:>8} {r['baseline_unplanned']:>9} {r['ours_verified']:>8} "
              f"{r['baseline_longest_wait_ok_s']!s:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
