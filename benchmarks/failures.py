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

``--json`` prints ``{"survive_s", "restart_s", "ratio", "survive_steps_lost",
"restart_steps_lost", "relaunch_s", "relaunch_ratio", "relaunch_steps_lost", ...}``. The
figures are wall-clock on whatever machine runs it; start-up (importing torch and megatron-core
in every rank) dominates the restart on CPU.
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


def _run(cfg: Path, log: Path, ranks: int, timeout_s: float) -> float:
    t0 = time.time()
    res = subprocess.run([sys.executable, "-m", "nereus", "run", str(cfg), "--ranks", str(ranks),
                          "--log", str(log), "--json", "--timeout-s", str(timeout_s)],
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--kill-step", type=int, default=3)
    p.add_argument("--after-s", type=float, default=0.5)
    p.add_argument("--checkpoint-every", type=int, default=2)
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not 0 < args.kill_step < args.steps:
        raise SystemExit("failures benchmark: need 0 < --kill-step < --steps")
    with tempfile.TemporaryDirectory(prefix="nereus-failures-") as d:
        out = measure(args.steps, args.kill_step, args.after_s, args.checkpoint_every, Path(d),
                      args.timeout_s)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"kill of node 2 (2 of 6 ranks) {args.after_s} s into step {args.kill_step}:")
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
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
