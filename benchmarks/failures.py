"""Node death: carrying on from the surviving replicas vs restarting from the latest checkpoint.

Both measured in this run, on the same job (PPO, tiny Megatron-core models, 3 virtual nodes of
2 CPU ranks, checkpoints every ``--checkpoint-every`` steps):

- **survive**: ``nereus run`` under ULFM; every rank of node 2 SIGKILLs itself ``--after-s``
  into step ``--kill-step``; the survivors shrink, rebuild from the replicas and go on. Time
  from the kill to the end of the step that was in flight (read from the run log's wall-clock
  rows and the dying ranks' kill stamps), and steps lost (completed steps whose work is redone).
- **restart**: what a checkpoint/restart framework does: the job is relaunched on the 4
  surviving ranks from the newest checkpoint written before the kill
  (``runtime.failures.resume``); time = the survive run's detection time (the MPI runtime
  notices the death the same way) + relaunch until the restarted job has completed the step
  that was in flight; steps lost = kill step − checkpoint step.

- **relaunch**: the same death taking Open MPI's runtime down with it (``kill: {runtime:
  true}``: every rank ends, ULFM has nobody to recover with); ``nereus run`` relaunches itself
  on the surviving nodes from the newest checkpoint (``runtime.failures.relaunch``). Time from
  the kill to the end of the step in flight in the relaunched segment's log; steps lost as for
  restart.

- **preemption** (``--preemption``; ``--preemption-only`` runs this row alone): a smaller job
  (PPO without a reward model, 3 virtual nodes of 1 CPU rank, ``adapt: false``, a periodic
  checkpoint every ``--checkpoint-every`` steps). SIGUSR1 (Slurm's warning) goes to the running
  ``nereus run`` once it printed step ``--signal-after``; the job stops at the next boundary,
  checkpoints and exits 75, and ``nereus run --resume`` is started at once in the same log. Time
  from the signal to the end of the resumed run's first step, steps lost (the restart event's
  ``redone_steps``), against a **cold restart** measured in the same invocation: the job killed
  at the signal with no checkpoint of its own, a fresh ``nereus run`` from the newest periodic
  checkpoint written before the signal, until it has done the same step (time from its launch:
  the kill itself is taken as free); steps lost = steps completed before the signal that it
  redoes.

``--json`` prints ``{"survive_s", "restart_s", "ratio", "survive_steps_lost",
"restart_steps_lost", "relaunch_s", "relaunch_ratio", "relaunch_steps_lost", ...}`` (and
``"preemption": {...}`` with ``--preemption``). The figures are wall-clock on whatever machine
runs it; start-up (importing torch and megatron-core in every rank) dominates the restart on
CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout: the log reader in-process
JOB = """
job: {algorithm: ppo, mode: sync, global_batch: 12, minibatches: 2, prompt_len: 8, gen_len: 16,
      reward_model: true}
models: {actor: tiny-gpt, critic: tiny-gpt, reference: tiny-gpt, reward: tiny-gpt}
"""


def _run(cfg: Path, log: Path, ranks: int, timeout_s: float, extra: tuple[str, ...] = ()
         ) -> float:
    t0 = time.time()
    res = subprocess.run([sys.executable, "-m", "nereus", "run", str(cfg), "--ranks", str(ranks),
                          "--log", str(log), "--json", "--timeout-s", str(timeout_s), *extra],
                         capture_output=True, text=True, cwd=ROOT, timeout=timeout_s + 60)
    if res.returncode != 0:
        raise SystemExit(f"failures benchmark: nereus run failed:\n{res.stderr[-3000:]}")
    return t0


def _step_done_at(log: Path, step: int, after: float) -> float:
    from nereus.log.reader import read_run_log

    rows = read_run_log(log).steps
    times = [float(t) for s, t in zip(rows["step"], rows["wall_time_s"], strict=True)
             if int(s) == step and float(t) > after]
    if not times:
        raise SystemExit(f"failures benchmark: step {step} not logged after the kill in {log}")
    return min(times)


def _failure_event(log: Path) -> dict[str, Any]:
    from nereus.log.reader import read_run_log

    ev = read_run_log(log).events
    found = [dict(d) for k, d in zip(ev["kind"], ev["detail"], strict=True) if k == "rank-failure"]
    if not found:
        raise SystemExit(f"failures benchmark: no rank-failure event in {log}")
    return found[0]


CLUSTER = "cluster: {nodes: 3, gpus_per_node: 2, gpu: cpu, memory_per_gpu_gb: 0.5}\n"


def _kill_config(path: Path, steps: int, every: int, ckpt: Path, kill_step: int, after_s: float,
                 relaunch: bool) -> Path:
    """The job with node 2's ranks killed ``after_s`` into ``kill_step``; with ``relaunch``
    the kill takes the MPI runtime down too and ``nereus run`` relaunches once."""
    runtime, again = (", runtime: true", "relaunch: 1, ") if relaunch else ("", "")
    path.write_text(JOB + CLUSTER + f"runtime: {{steps: {steps}, adapt: false, timeout_s: 30, "
                    f"failures: {{checkpoint_every: {every}, checkpoint_dir: {ckpt}, "
                    f"{again}kill: [{{node: 2, at_step: {kill_step}, "
                    f"after_s: {after_s}{runtime}}}]}}}}\n")
    return path


def _kill_time(log: Path) -> float:
    """When the first dying rank stamped its death (``<log>.kills``)."""
    return min(float(line.split()[1]) for line in Path(f"{log}.kills").read_text().splitlines())


def _checkpoints_before(ckpt: Path, t: float) -> list[Path]:
    """The complete checkpoints written before ``t``, oldest first."""
    from nereus.runtime.failures.checkpoint import CKPT_PREFIX

    return sorted(p for p in ckpt.glob(f"{CKPT_PREFIX}*.npz")
                  if ".part" not in p.name and p.stat().st_mtime < t)


def _step_of(checkpoint: Path) -> int:
    return int(checkpoint.stem.split("-")[1])


def measure(steps: int, kill_step: int, after_s: float, every: int, tmp: Path,
            timeout_s: float) -> dict[str, Any]:
    ckpt = tmp / "ckpt"
    log = tmp / "survive.h5"
    _run(_kill_config(tmp / "survive.yaml", steps, every, ckpt, kill_step, after_s, False), log, 6,
         timeout_s)
    kill_at = _kill_time(log)
    ev = _failure_event(log)
    survive_s = _step_done_at(log, kill_step, kill_at) - kill_at
    detect_s = float(ev["detect_unix_s"]) - kill_at

    # The restart baseline: relaunch on the survivors from the newest checkpoint before the kill.
    before = tmp / "ckpt-before-kill"
    before.mkdir()
    kept = _checkpoints_before(ckpt, kill_at)
    if not kept:
        raise SystemExit("failures benchmark: no checkpoint before the kill (lower "
                         "--checkpoint-every or raise --kill-step)")
    shutil.copy(kept[-1], before / kept[-1].name)
    ckpt_step = _step_of(kept[-1])
    cfg_r = tmp / "restart.yaml"
    cfg_r.write_text(JOB + CLUSTER.replace("nodes: 3", "nodes: 2")
                     + f"runtime: {{steps: {steps}, adapt: false, timeout_s: 30, "
                     f"failures: {{resume: {before}}}}}\n")
    log_r = tmp / "restart.h5"
    launched = _run(cfg_r, log_r, 4, timeout_s)
    restart_s = detect_s + (_step_done_at(log_r, kill_step, launched) - launched)
    # The runtime dies too: nereus run relaunches itself on the survivors from the checkpoint.
    log_l = tmp / "relaunch.h5"
    _run(_kill_config(tmp / "relaunch.yaml", steps, every, tmp / "ckpt-l", kill_step, after_s,
                      True), log_l, 6, timeout_s)
    kill_l = _kill_time(log_l)
    relaunch_s = _step_done_at(tmp / "relaunch.relaunch-1.h5", kill_step, kill_l) - kill_l
    from nereus.log.reader import read_run_log

    # where the time goes: kill -> the relaunched job's log exists (the runtime ending, the
    # relaunch, start-up) against launch -> the restarted job's log exists (start-up alone)
    relaunch_up_s = read_run_log(tmp / "relaunch.relaunch-1.h5").created_unix_s - kill_l
    restart_up_s = read_run_log(log_r).created_unix_s - launched
    kept_l = _checkpoints_before(tmp / "ckpt-l", kill_l)
    return {
        "survive_s": survive_s, "restart_s": restart_s, "ratio": restart_s / survive_s,
        "relaunch_s": relaunch_s, "relaunch_ratio": relaunch_s / survive_s,
        "relaunch_up_s": relaunch_up_s, "restart_up_s": restart_up_s,
        "relaunch_steps_lost": kill_step - _step_of(kept_l[-1]),
        "detect_s": detect_s, "recover_s": float(ev["recover_s"]),
        "survive_steps_lost": int(ev["steps_lost"]),
        "restart_steps_lost": kill_step - ckpt_step,
        "kill_step": kill_step, "checkpoint_step": ckpt_step,
        "restored_from": ev["restored_from"],
    }


PREEMPT_JOB = """
job: {algorithm: ppo, mode: sync, global_batch: 12, minibatches: 2, prompt_len: 8, gen_len: 16,
      reward_model: false}
models: {actor: tiny-gpt, critic: tiny-gpt, reference: tiny-gpt}
cluster: {nodes: 3, gpus_per_node: 1, gpu: cpu, memory_per_gpu_gb: 0.5}
"""


def _signal_run(args: list[str], after_step: int, timeout_s: float) -> tuple[int, float, str]:
    """``nereus run ARGS``; SIGUSR1 once it printed step ``after_step`` (1-based). Returns (exit
    status, when the signal went, its output)."""
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "nereus", "run", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    sent_at = 0.0
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            out.append(line)
            if not sent_at and line.startswith(f"step {after_step:>3}/"):
                proc.send_signal(signal.SIGUSR1)
                sent_at = time.time()
        code = proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
    return code, sent_at, "".join(out)


def _events(log: Path, kind: str) -> list[dict[str, Any]]:
    from nereus.log.reader import read_run_log

    ev = read_run_log(log).events
    return [dict(d) for k, d in zip(ev["kind"], ev["detail"], strict=True) if k == kind]


def _segment_started(log: Path, after: float) -> float:
    """When the first run segment started after ``after`` wrote its ``run-start`` event."""
    from nereus.log.reader import read_run_log

    ev = read_run_log(log).events
    return min(float(t) for k, t in zip(ev["kind"], ev["time_s"], strict=True)
               if k == "run-start" and float(t) > after)


def measure_preemption(steps: int, every: int, after_step: int, tmp: Path,
                       timeout_s: float) -> dict[str, Any]:
    """SIGUSR1 -> checkpoint -> --resume -> the resumed run's first step done, against a cold
    restart from the newest periodic checkpoint written before the signal."""
    from nereus.log.reader import read_run_log

    cfg = tmp / "preempt.yaml"
    cfg.write_text(PREEMPT_JOB + f"runtime: {{steps: {steps}, timeout_s: 30, adapt: false, "
                   f"failures: {{checkpoint_every: {every}}}}}\n")
    log = tmp / "preempt.h5"
    code, sent_at, out = _signal_run([str(cfg), "--log", str(log)], after_step, timeout_s)
    if code != 75 or not sent_at:
        raise SystemExit(f"failures benchmark: the preempted run exited {code}:\n{out[-3000:]}")
    exited_at = time.time()
    done_before = sum(1 for t in read_run_log(log).steps["wall_time_s"] if float(t) < sent_at)
    stop = int(_events(log, "preempted")[-1]["step"])
    launched = _run(cfg, log, 3, timeout_s, ("--resume",))
    restart = _events(log, "restart")[-1]
    resumed_s = _step_done_at(log, stop, launched) - sent_at
    resumed_step_s = _step_done_at(log, stop, launched) - launched
    # the cold restart: the newest periodic checkpoint the job had when the signal came
    kept = _checkpoints_before(log.parent / f"{log.name}.ckpt", sent_at)
    if not kept:
        raise SystemExit("failures benchmark: no periodic checkpoint before the signal (lower "
                         "--checkpoint-every or raise --signal-after)")
    cold_dir = tmp / "cold-ckpt"
    cold_dir.mkdir()
    shutil.copy(kept[-1], cold_dir / kept[-1].name)
    cfg_c = tmp / "cold.yaml"
    cfg_c.write_text(PREEMPT_JOB + f"runtime: {{steps: {steps}, timeout_s: 30, adapt: false, "
                     f"failures: {{resume: {cold_dir}}}}}\n")
    log_c = tmp / "cold.h5"
    launched_c = _run(cfg_c, log_c, 3, timeout_s)
    cold_s = _step_done_at(log_c, stop, launched_c) - launched_c
    return {
        "signal_after_step": after_step, "steps_done_at_signal": done_before,
        "stopped_at_step": stop, "checkpoint_s": exited_at - sent_at,
        "resume_s": resumed_s, "resume_steps_lost": len(restart.get("redone_steps", [])),
        "resume_from": Path(str(restart["from_checkpoint"])).name,
        "cold_s": cold_s, "cold_checkpoint_step": _step_of(kept[-1]),
        "cold_steps_lost": done_before - _step_of(kept[-1]),
        "cold_up_s": _segment_started(log_c, launched_c) - launched_c,
        "resume_up_s": _segment_started(log, launched) - launched,
        "ratio": cold_s / resumed_s, "resume_launch_to_step_s": resumed_step_s,
    }


def _print_kill(out: dict[str, Any], after_s: float, kill_step: int) -> None:
    print(f"kill of node 2 (2 of 6 ranks) {after_s} s into step {kill_step}:")
    print(f"  survive  {out['survive_s']:7.2f} s to the end of the step in flight "
          f"(detect {out['detect_s']:.2f} s, rebuild {out['recover_s']:.2f} s), "
          f"steps lost {out['survive_steps_lost']} (state from {out['restored_from']})")
    print(f"  restart  {out['restart_s']:7.2f} s from checkpoint step "
          f"{out['checkpoint_step']} (start-up {out['restart_up_s']:.2f} s), steps lost "
          f"{out['restart_steps_lost']}")
    print(f"  relaunch {out['relaunch_s']:7.2f} s (the runtime died too: nereus run relaunched "
          f"itself; kill -> relaunched log {out['relaunch_up_s']:.2f} s), steps lost "
          f"{out['relaunch_steps_lost']}")
    print(f"  restart / survive = {out['ratio']:.2f}x, relaunch / survive = "
          f"{out['relaunch_ratio']:.2f}x")


def _print_preemption(pr: dict[str, Any]) -> None:
    print(f"SIGUSR1 after step {pr['signal_after_step']} printed ({pr['steps_done_at_signal']} "
          f"steps logged), stopped at the boundary before step {pr['stopped_at_step']}:")
    print(f"  preempt+resume {pr['resume_s']:7.2f} s signal -> resumed step done (checkpoint "
          f"and exit {pr['checkpoint_s']:.2f} s, --resume launch -> step "
          f"{pr['resume_launch_to_step_s']:.2f} s of which start-up {pr['resume_up_s']:.2f} s), steps lost {pr['resume_steps_lost']} "
          f"(from {pr['resume_from']})")
    print(f"  cold restart   {pr['cold_s']:7.2f} s from periodic checkpoint step "
          f"{pr['cold_checkpoint_step']} (start-up {pr['cold_up_s']:.2f} s), steps lost "
          f"{pr['cold_steps_lost']}")
    print(f"  cold / preempt+resume = {pr['ratio']:.2f}x; load average {pr['load_avg']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--kill-step", type=int, default=3)
    p.add_argument("--after-s", type=float, default=0.5)
    p.add_argument("--checkpoint-every", type=int, default=2)
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--preemption", action="store_true", help="add the preemption row")
    p.add_argument("--preemption-only", action="store_true", help="the preemption row alone")
    p.add_argument("--preempt-steps", type=int, default=7)
    p.add_argument("--preempt-every", type=int, default=3,
                   help="the preempted job's periodic checkpoint_every")
    p.add_argument("--signal-after", type=int, default=5,
                   help="SIGUSR1 once step N (1-based) is printed")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not 0 < args.kill_step < args.steps:
        raise SystemExit("failures benchmark: need 0 < --kill-step < --steps")
    if not 0 < args.signal_after < args.preempt_steps:
        raise SystemExit("failures benchmark: need 0 < --signal-after < --preempt-steps")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="nereus-failures-") as d:
        if not args.preemption_only:
            out = measure(args.steps, args.kill_step, args.after_s, args.checkpoint_every,
                          Path(d), args.timeout_s)
        if args.preemption or args.preemption_only:
            load0 = os.getloadavg()[0]
            (Path(d) / "pre").mkdir()
            pr = measure_preemption(args.preempt_steps, args.preempt_every, args.signal_after,
                                    Path(d) / "pre", args.timeout_s)
            pr["load_avg"] = f"{load0:.1f} -> {os.getloadavg()[0]:.1f}"
            out["preemption"] = pr
    if args.json:
        print(json.dumps(out))
        return 0
    if not args.preemption_only:
        _print_kill(out, args.after_s, args.kill_step)
    if "preemption" in out:
        _print_preemption(out["preemption"])
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
