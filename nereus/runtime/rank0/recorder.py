"""Rank 0's record of the run: the HDF5 run log, the console, and the run's summary (effectful).

The recorder only records. What to record comes from the rank-0 loop
(:mod:`nereus.runtime.rank0.loop`) as plain data; the HDF5 run log (``nereus.log.writer``) gets
every step, replan, admission, transition and event; the console one progress line per step and
a summary table at the end (rich). ``rows``, ``transitions`` and ``transition_s`` are the run's
record so far: checkpoints and the failure replica carry them, and a resumed run goes on from
them.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from nereus.config.run import RunConfig
from nereus.config.schema import Config
from nereus.control.controller import Decision
from nereus.log.writer import RunLogWriter
from nereus.runtime.rank0.controller import plan_label
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan


def _raw_config(cfg: Config, rc: RunConfig) -> dict[str, Any]:
    return {"job": {"algorithm": cfg.setup.job.algorithm, "mode": cfg.setup.job.mode,
                    "global_batch": cfg.setup.job.global_batch},
            "runtime": rc.to_dict()}


class RunRecorder:
    def __init__(self, path: str, setup: Setup, rc: RunConfig, cfg: Config,
                 plan: ExecutionPlan, append: bool = False, fingerprint: Any = None) -> None:
        """``append``: continue the existing log at ``path`` (a resumed run); ``fingerprint``:
        the job's (:mod:`nereus.config.fingerprint`), in the run's meta and in the
        ``run-start`` event of this segment."""
        from rich.console import Console

        self.setup = setup
        self.rc = rc
        self.console = Console(highlight=False, width=200)
        meta = {"command": "nereus run", "ranks": rc.ranks, "steps": rc.steps,
                "hardware": "+".join(t.name for t in setup.cluster.types), "nodes": setup.cluster.nodes,
                "gpus_per_node": setup.cluster.gpus_per_node, "algorithm": setup.job.algorithm}
        job = {} if fingerprint is None else {"fingerprint": fingerprint.to_dict()}
        self.log = (RunLogWriter.append_to(path, {"resumed": True, "plan": plan.to_dict(),
                                                  "ranks": rc.ranks, "nodes": setup.cluster.nodes,
                                                  **job})
                    if append else
                    RunLogWriter(path, {**meta, **job}, _raw_config(cfg, rc),
                                 initial_plan=plan.to_dict(), start=job))
        self.rows: list[dict[str, Any]] = []
        self.transitions = 0
        self.transition_s = 0.0
        self.started = time.time()
        self.console.print(f"nereus run: {rc.ranks} ranks, {rc.steps} steps, initial plan "
                           f"{plan_label(plan)}")

    def event(self, step: int, kind: str, payload: dict[str, Any]) -> None:
        self.log.log_event(step, kind, payload)

    def step(self, step: int, *, step_s: float, stage_s: dict[str, float],
             peaks: dict[int, int], pool_gpus: int, r0: dict[str, Any],
             plan: ExecutionPlan) -> None:
        """The measurements of one step (``r0``: rank 0's step results, the batch-level values
        every rank shares)."""
        self.log.log_step(step, step_s=step_s, gen_len_mean=r0["len_mean"],
                          gen_len_p95=r0["len_p95"], pool_gpus=pool_gpus, stage_s=stage_s,
                          peak_memory_bytes=peaks, reward=r0["reward"], tokens=r0["tokens"],
                          flush=False)
        self.rows.append({"step": step, "reward": r0["reward"], "len": r0["len_mean"],
                          "step_s": step_s, "plan": plan_label(plan), "losses": r0["losses"],
                          "kl": r0["kl"], "tokens": r0["tokens"]})

    def calibration(self, step: int, hardware: str, stage_times: list[tuple[str, float, float]],
                    samples: list[tuple[str, float, float]], efficiencies: dict[str, float],
                    fixed_s: dict[str, float]) -> None:
        """The step's stage times against their prediction, the samples the calibration took
        from them, and the efficiencies and fixed costs it then holds."""
        for name, predicted, measured in stage_times:
            self.log.log_stage_time(step, name, predicted, measured)
        for op_class, ideal, measured in samples:
            self.log.log_calibration_sample(step, hardware, op_class, ideal, measured)
        for op_class, eff in sorted(efficiencies.items()):
            self.log.log_efficiency(step, hardware, op_class, eff)
        for event, seconds in sorted(fixed_s.items()):
            self.log.log_fixed_cost(step, hardware, event, seconds)

    def decision(self, step: int, d: Decision) -> None:
        """A replan and its admission."""
        adm = d.admission
        options = list(adm.options) if adm is not None else []
        # every target considered, with its transition and verdict (admission.OptionRecord)
        self.log.log_replan(step, ",".join(d.triggers), [o.to_dict() for o in options],
                            [o.step_s for o in options], None)
        if adm is not None:
            self.log.log_admission(
                step, adm.admitted, "opportunistic" if adm.path == "opportunistic" else "urgent",
                adm.reason, adm.delta_l_s, adm.transition_s, adm.horizon_steps)

    def say(self, text: str) -> None:
        self.console.print(text)

    def progress(self, step: int, pool_before: tuple[int, ...], pool: tuple[int, ...]) -> None:
        """The console line of step ``step`` (its row is the last one recorded)."""
        row = self.rows[-1]
        losses = " ".join(f"{k.split('-')[0]} {v:+.4f}" for k, v in row["losses"].items())
        self.console.print(
            f"step {step + 1:>3}/{self.rc.steps}  reward {row['reward']:.3f}  "
            f"len {row['len']:5.1f}  loss {losses}  {row['step_s']:6.2f} s  "
            f"plan {row['plan']}  transitions {self.transitions}"
            + (f"  pool {len(pool_before)}→{len(pool)}" if pool_before != pool else ""))
        self.log.flush()

    def transition(self, step: int, target: dict[str, Any], plan: ExecutionPlan,
                   measured_s: float, moved_bytes: int, lost: list[str],
                   executor: str = "gather-reload", primitives: list[Any] | None = None,
                   dag_detail: dict[str, Any] | None = None) -> None:
        """``executor``: "dag" (the transition DAG's primitives ran on the ranks) or
        "gather-reload" (the in-process fallback; ``dag_detail["reason"]`` says why).
        ``target["predicted_s"]`` is L̂_tran of the planned transition that ran."""
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
               else f"host-staged DAG {len(primitives or [])} primitives" if executor == "staged"
               else "ZeRO re-partition + gather+reload" if executor == "zero-repartition"
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
