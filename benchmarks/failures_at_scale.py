"""Node failures at 1,024 / 4,096 / 16,384 GPUs for a week: survive-and-replan (Nereus) against
checkpoint/restart at its best interval (issue 37, simulation).

**Job.** PPO with Llama-3.1-70B actor, critic and reference (``LLAMA_3_3_70B``: the same
architecture), rule-based reward, synchronous, one prompt per GPU (1,024 tokens, 2,048 generated,
p95 2,458), H100-80GB, 8 GPUs per node — the size of the *node_loss* job at 1,024 GPUs, its batch
grown with the cluster.

**Failures** (``nereus.sim.goodput``): Poisson per node at the Llama 3 rate — 419 unexpected
interruptions in 54 days on 16,384 H100s (2,048 nodes; data/SOURCES.md) — for 7 simulated days;
a failed node is back after an exponential repair time (mean ``--repair-h``, an assumption: the
paper gives no repair times). Both paths see the same draws; ``--seeds`` draws per scale.

**What the controller costs is measured, not assumed.** For each scale the real controller
(``controller_step`` through ``nereus run``'s port, ``CpuPort``, sticky placement, the
transition DAG compiler) runs the chain a failure sequence walks: lose node n₁, then n₂, … from
the full pool, and each node's return. Per step of the chain: the admitted target's predicted step
time (the survive path's plan), the planner's fastest plan (restart's plan, it reshards), L̂_tran
of the DAG (or of the gather+reload fallback where no DAG exists), the controller's decision time
(CPU and wall: observation → planned transition, cold: the cost tables rebuilt, as in ``nereus
run``, whose calibration changes every step), the framed order's size (``encode`` of the
``PlanChangeOrder``) and its broadcast time estimated from a binomial tree (⌈log₂ P⌉ hops of
latency + bytes over the inter-node link of the cost model, plus the digest agreement).

**Survive** per failure: detection + rebuild (measured by ``benchmarks/failures.py``: ULFM
detection and recovery on CPU ranks; the rebuild at scale at least the communicators a rank
creates × the preset's communicator set-up) + decision (the largest CPU time of the chain's
decisions: rank 0 has a core of its own on a cluster; wall times on this shared machine are
reported beside) + broadcast + L̂_tran, and the step in flight redone. A node that comes back is
taken when the controller's opportunistic admission pays it back: of its candidate targets
(S* and the slower ones with cheaper transitions, ``nereus.control.options``, each with its
planned transition) the best payback value against the horizon H the run has learned. **Restart** per failure: detection + start-up (measured, CPU ranks: a lower bound
of a 16k-GPU job's) + reading every model-stage's state at the storage bandwidth (Llama 3's
Tectonic: 2 TB/s sustained at 16,384 GPUs, scaled by the job's share of them) + the same
communicators; the work since the last checkpoint and the step in flight lost; a checkpoint
(the trainable state at that bandwidth) every Daly-optimal interval for the job's MTBF.

Goodput = kept steps × failure-free step time / wall time, with a 95% interval over the seeds.

    python3 benchmarks/failures_at_scale.py [--json] [--seeds N] [--days D] [--repair-h H]
        [--scales 1024,4096,16384] [--measured failures.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nereus.control.controller import ControllerState, controller_step
from nereus.control.planner_port import SearchPort, plan_step_s, setup_for
from nereus.control.signals import Observation
from nereus.cost.calibration import default_calibration
from nereus.cost.latency import COLLECTIVE_LATENCY_S
from nereus.plan.candidates import CostCache
from nereus.runtime.mpi.frames import encode
from nereus.runtime.rank0.controller import CpuPort
from nereus.sim.goodput import daly_interval_s, draw_events, mean_ci95, restart, survive
from nereus.spec.hardware import H100_80GB, ClusterSpec
from nereus.spec.job import JobSpec, Setup
from nereus.spec.model import LLAMA_3_3_70B, state_bytes_per_param
from nereus.spec.plan import ExecutionPlan
from nereus.transition.order import PlanChangeOrder

GPN = 8
# Llama 3 (arXiv 2407.21783, §3.3.4): 419 unexpected interruptions in a 54-day snapshot on
# 16,384 H100s; §3.3.1: Tectonic sustains 2 TB/s of checkpoint writes (7 TB/s peak).
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_NODES = 419, 54, 16384 // GPN
STORAGE_BPS_AT_16K = 2e12
# benchmarks/failures.py, RESULTS.md *failures* (2026-12-02, 4 CPU ranks): ULFM detection,
# recovery (shrink, rebuild, restore from replicas), and a fresh nereus run's start-up.
MEASURED = {"detect_s": 0.30, "recover_s": 1.21, "restart_up_s": 14.95}
GROUPS_PER_UNIT = 5  # tp, pp, solo, embd, pos_embd (nereus.engines.megatron_model.StageGroups)


def job_at(gpus: int) -> Setup:
    m = LLAMA_3_3_70B
    job = JobSpec("ppo", "sync", (("actor", m), ("critic", m), ("reference", m)),
                  global_batch=gpus, prompt_len=1024, gen_len=2048, gen_len_p95=2458,
                  reward_model=False)
    return Setup(job, ClusterSpec(gpus // GPN, GPN, H100_80GB))


@dataclass
class Link:
    """One step of the failure chain: the plan after it and what the controller paid."""

    down: int
    step_s: float  # the admitted plan's predicted step time (survive runs it)
    best_s: float  # the planner's fastest plan on that pool (restart reshards into it)
    transition_s: float  # L̂_tran of the admitted transition
    executor: str  # dag | gather-reload | none
    primitives: int
    decision_cpu_s: float
    decision_wall_s: float
    frame_bytes: int
    plan: ExecutionPlan = field(repr=False)


def _bcast_s(ranks: int, nbytes: int, setup: Setup) -> float:
    """Binomial-tree broadcast of the framed order plus the digest agreement (an all-reduce of
    64 bytes: 2 ⌈log₂ P⌉ latencies), on the cost model's inter-node link and latency."""
    hops = max(1, math.ceil(math.log2(max(ranks, 2))))
    alpha = COLLECTIVE_LATENCY_S["nvidia"][1]
    beta = setup.cluster.gpu.inter_node_gbps * 1e9
    return hops * (alpha + nbytes / beta) + 2 * hops * alpha


class Chain:
    """The controller's decisions as nodes leave one after another (and come back)."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.cache = CostCache()
        self.calib = default_calibration()
        self.nodes = setup.cluster.nodes
        job = setup.job
        self.obs_len = (float(job.gen_len), float(job.gen_len_p95 or job.gen_len))
        pool = setup.cluster.all_gpus()
        state, d, cpu, wall = self._step(ControllerState(), pool, 0)
        assert state.plan is not None, d
        s0 = plan_step_s(setup_for(setup, self.obs(pool, 0)), state.plan, self.calib)
        self.initial_cpu_s, self.initial_wall_s = cpu, wall
        self.links = [Link(0, s0, s0, 0.0, "none", 0, cpu, wall, 0, state.plan)]
        self.states = [state]
        self.up: dict[int, list[Link]] = {}

    def obs(self, pool: tuple[int, ...], step: int) -> Observation:
        return Observation(step, *self.obs_len, pool)

    def _port(self, pool: tuple[int, ...]) -> CpuPort:
        return CpuPort(SearchPort(self.setup, self.calib, pool=pool, cache=self.cache))

    def _step(self, state: ControllerState, pool: tuple[int, ...], step: int, cold: bool = True
              ) -> tuple[ControllerState, Any, float, float]:
        if cold:  # as nereus run: its calibration changes every step, every table re-costed
            self.cache = CostCache()
        c, w = time.process_time(), time.perf_counter()
        new, d = controller_step(state, self.obs(pool, step), self.setup.job.controller,
                                 self._port(pool))
        return new, d, time.process_time() - c, time.perf_counter() - w

    def lost(self, k: int) -> tuple[int, ...]:
        """The first ``k`` nodes to fail: a fixed random order of the nodes."""
        order = np.random.Generator(np.random.PCG64(37)).permutation(self.nodes)
        return tuple(int(n) for n in order[:k])

    def pool(self, k: int) -> tuple[int, ...]:
        gone = set(self.lost(k))
        return tuple(g for g in self.setup.cluster.all_gpus() if g // GPN not in gone)

    def down(self, k: int) -> Link:
        """The plan after the k-th failure (from the plan after the (k−1)-th)."""
        while len(self.links) <= k:
            j = len(self.links)
            pool = self.pool(j)
            state, d, cpu, wall = self._step(self.states[j - 1], pool, 2 * j)
            adm = d.admission
            assert adm is not None and adm.admitted and adm.target is not None, d
            planned = adm.transition
            if planned is None:  # the port costs a restart when no DAG exists
                planned = self._port(pool).transition(self.states[j - 1].plan, adm.target)
            s = setup_for(self.setup, self.obs(pool, 2 * j))
            best = self._port(pool).search(self.obs(pool, 2 * j))
            assert best is not None
            order = PlanChangeOrder.of(adm.target, pool, "urgent", planned, 1)
            prefix, payload = encode(order.to_wire(), "plan")
            dag = planned.dag if planned.executor == "dag" else None
            self.links.append(Link(
                j, plan_step_s(s, adm.target, self.calib), best[1], planned.cost_s,
                planned.executor, 0 if dag is None else len(dag.primitives), cpu, wall,
                len(prefix) + len(payload), adm.target))
            self.states.append(state)
        return self.links[k]

    def grow(self, k: int) -> list[Link]:
        """From the plan for k nodes down, the k-th node back: the controller's candidate
        targets (S* and slower ones with cheaper transitions) with their planned transitions;
        which one is admitted is the simulator's to decide (it needs the horizon)."""
        if k not in self.up:
            self.down(k)
            pool = self.pool(k - 1)
            port = self._port(pool)
            c, w = time.process_time(), time.perf_counter()
            opts = port.options(self.obs(pool, 2 * k + 1), self.states[k].plan)
            planned = [port.transition(self.states[k].plan, target) for target, _ in opts]
            cpu, wall = time.process_time() - c, time.perf_counter() - w
            links = []
            for (target, step), pt in zip(opts, planned, strict=True):
                order = PlanChangeOrder.of(target, pool, "opportunistic", pt, 1)
                prefix, payload = encode(order.to_wire(), "plan")
                dag = pt.dag if pt.executor == "dag" else None
                links.append(Link(k - 1, step, step, pt.cost_s, pt.executor,
                                  0 if dag is None else len(dag.primitives), cpu, wall,
                                  len(prefix) + len(payload), target))
            self.up[k] = links
        return self.up[k]


def replan_parts(chain: Chain) -> dict[str, float]:
    """CPU seconds of the parts of the first failure's urgent replan, done again piece by
    piece: every model-stage's cost table (the cold re-costing), the planner's fastest plan and
    the plan keeping the layouts (the two options), and the DAG of each."""
    setup, pool = chain.setup, chain.pool(1)
    obs = chain.obs(pool, 2)
    current = chain.states[0].plan
    assert current is not None
    cache = CostCache()
    out: dict[str, float] = {}
    c = time.process_time()
    s = setup_for(setup, obs)
    for ms in setup.job.workflow.model_stages:
        cache.table(s, ms, chain.calib)
    out["cost_tables_s"] = time.process_time() - c
    port = CpuPort(SearchPort(setup, chain.calib, pool=pool, cache=cache, keep=current))
    c = time.process_time()
    best = port.search(obs)
    out["search_fastest_s"] = time.process_time() - c
    c = time.process_time()
    pinned = port.search(obs, {sp.name: (sp.tp, sp.pp) for sp in current.stages})
    out["search_keep_layouts_s"] = time.process_time() - c
    for name, found in (("dag_fastest_s", best), ("dag_keep_layouts_s", pinned)):
        assert found is not None
        c = time.process_time()
        port.transition(current, found[0])
        out[name] = time.process_time() - c
    return out


def _state_bytes(setup: Setup, trainable_only: bool) -> int:
    """Bytes of the job's logical states (one per state: actor-gen keeps actor-train's), the
    trained ones with their Adam state; ``trainable_only``: what a checkpoint writes (the
    reference is read back from its own checkpoint)."""
    per: dict[str, int] = {}
    for ms in setup.job.workflow.model_stages:
        if trainable_only and not ms.trainable:
            continue
        params = setup.job.model(ms.role).num_params()
        nbytes = params * state_bytes_per_param(setup.job.dtype_bytes, ms.trainable)
        per[ms.state] = max(per.get(ms.state, 0), nbytes)
    return sum(per.values())


def run_scale(gpus: int, seeds: int, days: float, repair_h: float, measured: dict[str, float],
              ) -> dict[str, Any]:
    setup = job_at(gpus)
    chain = Chain(setup)
    nodes = setup.cluster.nodes
    horizon = days * 86400.0
    rate = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 86400.0 * LLAMA3_NODES)  # per node-second
    draws = [draw_events(nodes, rate, repair_h * 3600.0, horizon, seed) for seed in range(seeds)]
    plan0 = chain.links[0].plan
    groups = sum(GROUPS_PER_UNIT + (1 if sp.dp > 1 and setup.job.workflow.by_name(
        sp.name).trainable else 0) for sp in plan0.stages)  # a rank in every model-stage
    rebuild = max(measured["recover_s"], groups * setup.cluster.gpu.comm_setup_s)
    storage_bps = STORAGE_BPS_AT_16K * gpus / 16384
    ckpt_s = _state_bytes(setup, True) / storage_bps
    read_s = _state_bytes(setup, False) / storage_bps
    mtbf = 1.0 / (rate * nodes)
    interval = daly_interval_s(ckpt_s, mtbf)
    restart_s = measured["detect_s"] + measured["restart_up_s"] + read_s \
        + groups * setup.cluster.gpu.comm_setup_s
    # the chain as deep as any draw needs: survive's plan may lag the pool when a growth is
    # refused, so a failure can take it below the concurrent minimum; extended on demand
    rows: dict[str, list[Any]] = {"survive": [], "restart": []}
    for ev in draws:
        while True:
            try:
                k_max = len(chain.links) - 1
                step_n = [chain.links[k].step_s for k in range(k_max + 1)]
                step_r = [chain.links[k].best_s for k in range(k_max + 1)]
                down_s = [0.0] + [chain.links[k].transition_s for k in range(1, k_max + 1)]
                grow = [[]] + [[(lk.step_s, lk.transition_s) for lk in chain.grow(k)]
                               for k in range(1, k_max + 1)]
                # the decision at its CPU time: rank 0's controller has a core of its own on
                # a cluster, where this shared machine stretches wall time several-fold
                survive_s = measured["detect_s"] + rebuild + max(
                    lk.decision_cpu_s for lk in chain.links[1:] or chain.links) + max(
                    _bcast_s(gpus, lk.frame_bytes, setup) for lk in chain.links)
                s = survive(ev, nodes, horizon, step_n, survive_s, down_s, grow,
                            setup.job.controller.gamma, setup.job.controller.horizon_alpha)
                r = restart(ev, nodes, horizon, step_r, restart_s, ckpt_s, interval)
                break
            except ValueError:  # deeper than the chain: one more node down
                chain.down(len(chain.links))
        rows["survive"].append(s)
        rows["restart"].append(r)
    links = chain.links[1:]
    ups = [lk for k in sorted(chain.up) for lk in chain.up[k]]
    out: dict[str, Any] = {
        "gpus": gpus, "nodes": nodes, "seeds": seeds, "days": days, "repair_h": repair_h,
        "step_s": chain.links[0].step_s, "mtbf_h": mtbf / 3600.0,
        "failures_per_seed": mean_ci95([o.failures for o in rows["restart"]]),
        "checkpoint_s": ckpt_s, "checkpoint_interval_s": interval, "restart_s": restart_s,
        "survive_s": survive_s, "rebuild_s": rebuild, "chain_depth": len(links),
        "plans": [{"down": lk.down, "step_s": lk.step_s, "best_s": lk.best_s,
                   "transition_s": lk.transition_s, "executor": lk.executor,
                   "primitives": lk.primitives, "decision_cpu_s": lk.decision_cpu_s,
                   "decision_wall_s": lk.decision_wall_s, "frame_bytes": lk.frame_bytes}
                  for lk in chain.links],
        "growth": [{"down": lk.down, "transition_s": lk.transition_s, "executor": lk.executor,
                    "decision_cpu_s": lk.decision_cpu_s, "frame_bytes": lk.frame_bytes}
                   for lk in ups],
        "initial_plan_cpu_s": chain.initial_cpu_s, "initial_plan_wall_s": chain.initial_wall_s,
        "replan_parts_cpu_s": replan_parts(chain),
        "replan_cpu_s": max(lk.decision_cpu_s for lk in links),
        "replan_wall_s": max(lk.decision_wall_s for lk in links),
        "frame_bytes": max(lk.frame_bytes for lk in links + ups),
        "bcast_s": max(_bcast_s(gpus, lk.frame_bytes, setup) for lk in links + ups),
    }
    for name, outs in rows.items():
        out[name] = {
            "goodput": mean_ci95([o.goodput for o in outs]),
            "steps_lost": mean_ci95([o.steps_lost for o in outs]),
            "transition_s": mean_ci95([o.transition_s for o in outs]),
            "checkpoint_s": mean_ci95([o.checkpoint_s for o in outs]),
            "lost_work_s": mean_ci95([o.lost_work_s for o in outs]),
            "degraded_h": mean_ci95([o.degraded_s / 3600.0 for o in outs]),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--repair-h", type=float, default=4.0)
    ap.add_argument("--scales", default="1024,4096,16384")
    ap.add_argument("--measured", help="benchmarks/failures.py --json output (detect_s, "
                    "recover_s, restart_up_s); default: the RESULTS.md run")
    ap.add_argument("--restart-up-s", type=float, help="override the restart's start-up")
    args = ap.parse_args()
    measured = dict(MEASURED)
    if args.measured:
        got = json.loads(Path(args.measured).read_text())
        measured.update({k: float(got[k]) for k in MEASURED})
    if args.restart_up_s is not None:
        measured["restart_up_s"] = args.restart_up_s
    load = os.getloadavg()[0]
    rows = [run_scale(int(g), args.seeds, args.days, args.repair_h, measured)
            for g in args.scales.split(",")]
    if args.json:
        print(json.dumps({"rows": rows, "measured": measured, "load_avg_1min": load}))
        return 0
    print(f"{'GPUs':>6} {'path':>8} {'goodput %':>15} {'steps lost':>12} {'transitions s':>15} "
          f"{'checkpoints s':>14} {'degraded h':>11}")
    for r in rows:
        for name in ("survive", "restart"):
            g, sl, tr, ck, dg = (r[name][k] for k in ("goodput", "steps_lost", "transition_s",
                                                      "checkpoint_s", "degraded_h"))
            print(f"{r['gpus']:>6} {name:>8} {100 * g[0]:>8.2f} ± {100 * g[1]:<4.2f} "
                  f"{sl[0]:>7.1f} ± {sl[1]:<3.1f} {tr[0]:>9.0f} ± {tr[1]:<4.0f} {ck[0]:>14.0f} "
                  f"{dg[0]:>11.1f}")
        print(f"       step {r['step_s']:.1f} s, MTBF {r['mtbf_h']:.2f} h, failures/week "
              f"{r['failures_per_seed'][0]:.1f}; restart {r['restart_s']:.1f} s, checkpoint "
              f"{r['checkpoint_s']:.2f} s every {r['checkpoint_interval_s']:.0f} s; survive "
              f"{r['survive_s']:.2f} s + L̂_tran; replan {r['replan_cpu_s']:.2f} s CPU / "
              f"{r['replan_wall_s']:.2f} s wall; frame {r['frame_bytes'] / 2**20:.2f} MiB "
              f"(bcast ≈ {1e3 * r['bcast_s']:.2f} ms); chain depth {r['chain_depth']}")
        parts = ", ".join(f"{k[:-2]} {v:.2f}" for k, v in r["replan_parts_cpu_s"].items())
        print(f"       replan parts (CPU s): {parts}")
    print(f"1-minute load average: {load:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
