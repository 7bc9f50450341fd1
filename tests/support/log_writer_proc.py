"""A real writer process for tests/ranks/test_log_writer_procs.py: logs every record type each step, flushes, reports.

``python tests/log_writer_proc.py PATH [--steps N] [--sleep S] [--gpus G] [--wait-go]
[--pause-every K]`` prints ``ready`` once the file exists in SWMR mode (with --wait-go it then
waits for a line on stdin), then the step number after each step's flush (with --pause-every K,
after a step with ``step % K == 1`` it waits for a line on stdin, so that a reader reads while
the writer holds the file open however slow the host), so that a test that kills this process knows the
last step that must read back. Every value is a function of the step: see ``expected_step_s`` and
``expected_peak_bytes``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nereus.log.writer import RunLogWriter

STAGES = ("actor-gen", "ref-inf", "actor-train")


def expected_step_s(step: int) -> float:
    return 1.0 + 0.01 * step


def expected_peak_bytes(step: int, gpu: int) -> int:
    return (step + 1) * 1_000_000 + gpu


def plan_for(version: int, gpus: int) -> dict[str, object]:
    dp = 1 + version % 2
    tp = max(1, gpus // dp)
    replicas = [[r * tp + t for t in range(tp)] for r in range(dp)]
    return {
        "stages": [
            {
                "name": n,
                "tp": tp,
                "pp": 1,
                "dp": dp,
                "micro_batch": 1,
                "grad_accum": 1,
                "recompute": False,
                "replicas": replicas,
            }
            for n in STAGES
        ]
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--wait-go", action="store_true", help="after ready, wait for a stdin line")
    ap.add_argument("--pause-every", type=int, default=0,
                    help="after a step with step %% K == 1, wait for a stdin line")
    args = ap.parse_args()
    meta = {"job": "kill-test", "algorithm": "ppo", "gpus": args.gpus}
    config = {"model": "tiny-gpt", "steps": args.steps, "gamma": 0.5}
    version = 0
    with RunLogWriter(args.path, meta, config, initial_plan=plan_for(0, args.gpus)) as log:
        print("ready", flush=True)
        if args.wait_go:
            sys.stdin.readline()
        for step in range(args.steps):
            log.log_calibration_sample(
                step, "cpu", "gemm", 0.1 * (step + 1), 0.1 * (step + 1) / 0.7
            )
            if step % 3 == 0:
                log.log_efficiency(step, "cpu", "gemm", 0.7)
            if step % 7 == 6:
                log.log_event(step, "gpu-pool-change", {"gpus": args.gpus, "note": "x" * step})
            log.log_step(
                step,
                step_s=expected_step_s(step),
                gen_len_mean=100.0 + step,
                gen_len_p95=150.0 + step,
                pool_gpus=args.gpus,
                stage_s={n: expected_step_s(step) / len(STAGES) for n in STAGES},
                peak_memory_bytes={g: expected_peak_bytes(step, g) for g in range(args.gpus)},
                reward=0.5,
                tokens=1000 + step,
            )
            print(step, flush=True)
            if args.pause_every and step % args.pause_every == 1:
                sys.stdin.readline()
            if step % 5 == 4:
                cands = [plan_for(version + 1, args.gpus), plan_for(version, args.gpus)]
                log.log_replan(step, "drift-length", cands, [0.9, 1.0], [2e9, 1e9])
                admitted = step % 10 == 4
                log.log_admission(
                    step,
                    admitted,
                    "opportunistic",
                    "gain pays back" if admitted else "transition too slow",
                    0.1,
                    0.05,
                    3.0,
                )
                if admitted:
                    version += 1
                    log.log_transition(
                        step,
                        {"nodes": [], "edges": []},
                        [{"op": "split"}],
                        4096 * step,
                        0.05,
                        0.06,
                        plan_for(version, args.gpus),
                    )
            if args.sleep:
                time.sleep(args.sleep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
