"""Rank 0's side of a step boundary: log, print, apply events, ask the controller (effectful).

The HDF5 run log (``nereus.log.writer``) gets every step, replan, admission, transition and
event; the console gets one progress line per step and a summary table at the end (rich).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np

from nereus.config.run import RunConfig
from nereus.config.schema import Config
from nereus.control.planner_port import setup_for
from nereus.control.signals import Observation
from nereus.cost.memory import gpu_memory
from nereus.log.writer import RunLogWriter
from nereus.runtime.rank0.controller import RankZeroController, decision_dict, plan_label
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan


def _raw_config(cfg: Config, rc: RunConfig) -> dict[str, Any]:
    return {"job": {"algorithm": cfg.setup.job.algorithm, "mode": cfg.setup.job.mode,
                    "global_batch": cfg.setup.job.global_batch},
            "runtime": rc.to_dict()}


class RunRecorder:
    def __init__(self, path: str, setup: Setup, rc: RunConfig, cfg: Config,
                 plan: ExecutionPlan) -> None:
        from rich.console import Console

        self.setup = setup
        self.rc = rc
        self.console = Console(highlight=False, width=200)
        meta = {"command": "nereus run", "ranks": rc.ranks, "steps": rc.steps,
                "hardware": setup.cluster.gpu.name, "nodes": setup.cluster.nodes,
                "gpus_per_node": setup.cluster.gpus_per_node, "algorithm": setup.job.algorithm}
        self.log = RunLogWriter(path, meta, _raw_config(cfg, rc), initial_plan=plan.to_dict())
        self.rows: list[dict[str, Any]] = []
        self.transitions = 0
        self.transition_s = 0.0
        self.started = time.time()
        self.console.print(f"nereus run: {rc.ranks} ranks, {rc.steps} steps, initial plan "
                           f"{plan_label(plan)}")

    def after_step(self, step: int, gathered: list[dict[str, Any]], ctl: RankZeroController,
                   plan: ExecutionPlan) -> dict[str, Any] | None:
        r0 = gathered[0]
        step_s = max(g["step_s"] for g in gathered)
        stage_s: dict[str, float] = {}
        for g in gathered:
            for k, v in g["stage_s"].items():
                stage_s[k] = max(stage_s.get(k, 0.0), v)
        peaks = {g["rank"]: int(g["peak_bytes"]) for g in gathered}
        self.log.log_step(step, step_s=step_s, gen_len_mean=r0["len_mean"],
                          gen_len_p95=r0["len_p95"], pool_gpus=len(ctl.pool), stage_s=stage_s,
                          peak_memory_bytes=peaks, reward=r0["reward"], tokens=r0["tokens"],
                          flush=False)
        ooms = [e for g in gathered for e in g["oom"]]
        if ooms:
            self._on_ooms(step, ctl, plan, ooms, r0)
        row = {"step": step, "reward": r0["reward"], "len": r0["len_mean"], "step_s": step_s,
               "plan": plan_label(plan), "losses": r0["losses"], "kl": r0["kl"],
               "tokens": r0["tokens"]}
        self.rows.append(row)
        pool_before = ctl.pool
        for ev in self.rc.events:
            if ev.at_step != step:
                continue
            node = set(range(ev.node * self.setup.cluster.gpus_per_node,
                             (ev.node + 1) * self.setup.cluster.gpus_per_node))
            pool = set(ctl.pool) - node if ev.kind == "remove_node" else set(ctl.pool) | node
            ctl.set_pool(sorted(pool))
            self.log.log_event(step, "gpu-pool-change", {**ev.to_dict(), "pool": list(ctl.pool)})
        obs = Observation(step + 1, r0["len_mean"], r0["len_p95"], ctl.pool, step_s=step_s)
        target: ExecutionPlan | None = None
        kind = ""
        forced = [t for t in self.rc.force_transitions if t.at_step == step]
        if forced:
            target = ctl.forced(obs, dict(forced[0].layouts))
            kind = "forced"
            self.log.log_event(step, "forced-transition",
                               {**forced[0].to_dict(), "found": target is not None})
            if target is None:
                self.console.print(f"  forced transition after step {step + 1}: no plan with "
                                   f"{forced[0].to_dict()['layouts']} fits; plan kept")
        elif step < self.rc.steps - 1:
            d = ctl.after_step(obs)
            if d is not None and d.replanned:
                dd = decision_dict(d)
                self.log.log_replan(step, ",".join(d.triggers), dd, dd["transition_s"],
                                    None)
                adm = d.admission
                if adm is not None:
                    self.log.log_admission(
                        step, adm.admitted, "opportunistic" if adm.path == "opportunistic"
                        else "urgent", adm.reason, adm.delta_l_s, adm.transition_s,
                        adm.horizon_steps)
                if adm is not None and adm.admitted and adm.target is not None \
                        and adm.target != plan:
                    target, kind = adm.target, adm.path
                elif adm is not None and not adm.admitted and d.lost_gpus:
                    # Emulation: the removed ranks are alive, so the job goes on on the current
                    # plan (a real job would checkpoint and wait for the pool to change).
                    self.log.log_event(step, "no-feasible-plan", {"reason": adm.reason})
                    self.console.print(f"  no plan fits the pool after step {step + 1}: "
                                       f"{adm.reason}; continuing on the current plan")
        losses = " ".join(f"{k.split('-')[0]} {v:+.4f}" for k, v in r0["losses"].items())
        self.console.print(
            f"step {step + 1:>3}/{self.rc.steps}  reward {r0['reward']:.3f}  "
            f"len {r0['len_mean']:5.1f}  loss {losses}  {step_s:6.2f} s  "
            f"plan {plan_label(plan)}  transitions {self.transitions}"
            + (f"  pool {len(pool_before)}→{len(ctl.pool)}" if pool_before != ctl.pool else ""))
        self.log.flush()
        if target is None or target == plan:
            return None
        predicted = ctl.port().transition_s(plan, target) or 0.0
        return {"plan": target.to_dict(), "pool": list(ctl.pool), "kind": kind,
                "predicted_s": predicted}

    def _on_ooms(self, step: int, ctl: RankZeroController, plan: ExecutionPlan,
                 ooms: list[dict[str, Any]], r0: dict[str, Any]) -> None:
        """Ranks went over their capacity: log every event, give the controller the capacity
        the devices report (when it fell), and where the memory model predicted less than was
        measured, scale that model-stage's estimate up — the controller then finds the current
        plan infeasible and takes the urgent path."""
        for e in ooms:
            self.log.log_event(step, "oom", e)
        cap = min(int(e["capacity_bytes"]) for e in ooms)
        gpu = ctl.setup.cluster.gpu
        if cap < gpu.memory_bytes:
            cluster = replace(ctl.setup.cluster, gpu=replace(gpu, memory_bytes=cap))
            ctl.setup = replace(ctl.setup, cluster=cluster)
            self.log.log_event(step, "capacity-change", {"from_bytes": gpu.memory_bytes,
                                                         "to_bytes": cap})
        obs = Observation(0, r0["len_mean"], r0["len_p95"], ctl.pool)
        base = ctl.calib
        predicted = gpu_memory(setup_for(ctl.setup, obs), plan, base)
        ratio: dict[str, tuple[float, float, int]] = {}  # stage -> worst (ratio, before, peak)
        for e in ooms:
            before = predicted.get(e["global_rank"], 0) / base.memory_factor(e["model_stage"])
            if 0 < predicted.get(e["global_rank"], 0) < e["peak_bytes"]:
                r = e["peak_bytes"] / before
                if r > ratio.get(e["model_stage"], (0.0, 0.0, 0))[0]:
                    ratio[e["model_stage"]] = (r, before, int(e["peak_bytes"]))
        for name, (_, before, peak) in sorted(ratio.items()):
            # the sample is the prediction before the factor
            ctl.calib = ctl.calib.with_memory_sample(name, before, peak, 1.0)
        worst = max(ooms, key=lambda e: e["peak_bytes"] - e["capacity_bytes"])
        self.console.print(
            f"  OOM in step {step + 1} on {len({e['global_rank'] for e in ooms})} rank(s), e.g. "
            f"rank {worst['global_rank']} in {worst['model_stage']}: "
            f"{worst['peak_bytes'] / 1e6:.1f} MB > {worst['capacity_bytes'] / 1e6:.1f} MB")

    def transition(self, step: int, target: dict[str, Any], plan: ExecutionPlan,
                   measured_s: float, moved_bytes: int, lost: list[str],
                   executor: str = "gather-reload", primitives: list[Any] | None = None,
                   dag_detail: dict[str, Any] | None = None) -> None:
        """``executor``: "dag" (the transition DAG's primitives ran on the ranks) or
        "gather-reload" (the in-process fallback; ``dag_detail["reason"]`` says why)."""
        self.transitions += 1
        self.transition_s += measured_s
        self.log.log_transition(step, {"kind": target["kind"], "executor": executor,
                                       **(dag_detail or {})},
                                primitives or [], moved_bytes,
                                float(target.get("predicted_s", 0.0)), measured_s,
                                plan=plan.to_dict())
        if lost:
            self.log.log_event(step, "restart", {"state_read_from_removed_ranks": lost})
        how = (f"DAG {len(primitives or [])} primitives" if executor == "dag"
               else "gather+reload")
        self.console.print(f"  transition after step {step + 1} ({target['kind']}, "
                           f"{how} {measured_s:.2f} s): {plan_label(plan)}")
        self.log.flush()

    def finish(self) -> dict[str, Any]:
        from rich.table import Table

        table = Table(title="nereus run")
        wrap = {"plan": {"no_wrap": True}}
        for col in ("step", "reward", "mean len", "actor loss", "critic loss", "step s", "plan"):
            table.add_column(col, **wrap.get(col, {}))  # type: ignore[arg-type]
        for r in self.rows:
            table.add_row(str(r["step"] + 1), f"{r['reward']:.3f}", f"{r['len']:.1f}",
                          f"{r['losses'].get('actor-train', float('nan')):+.4f}",
                          f"{r['losses'].get('critic-train', float('nan')):+.4f}",
                          f"{r['step_s']:.2f}", r["plan"])
        self.console.print(table)
        total = sum(r["step_s"] for r in self.rows) + self.transition_s
        tokens = sum(r["tokens"] for r in self.rows)
        summary = {
            "steps": len(self.rows), "transitions": self.transitions,
            "transition_s": self.transition_s, "total_s": total,
            "tokens_per_s": tokens / total if total > 0 else 0.0,
            "transition_share_pct": 100.0 * self.transition_s / total if total > 0 else 0.0,
            "rewards": [r["reward"] for r in self.rows],
            "losses": [r["losses"] for r in self.rows],
            "lengths": [r["len"] for r in self.rows],
            "plans": [r["plan"] for r in self.rows],
            "mean_step_s": float(np.mean([r["step_s"] for r in self.rows])) if self.rows else 0.0,
        }
        self.console.print(
            f"{summary['steps']} steps, {self.transitions} transitions "
            f"({self.transition_s:.2f} s, {summary['transition_share_pct']:.1f}% of "
            f"{total:.1f} s), {summary['tokens_per_s']:.1f} generated tokens/s")
        self.log.close()
        return summary
