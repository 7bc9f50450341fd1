"""Per-GPU memory of Llama-3.1-8B actor training on 16 A100-64GB GPUs, from Nereus' memory model.

Prints the breakdown of the most loaded GPU for (dp, tp, pp) = (4, 2, 2) and (4, 4, 1) at 2K and
4K generated tokens, beside the Nereus paper's observation ((4,2,2) fits at 2K but runs out of
memory at 4K; (4,4,1) fits at 4K). Batch assumptions: 1,024-token prompts, global batch 64
prompts, one response each, one optimizer update per step, micro-batch 1 (grad_accum 16 at dp 4),
1F1B pipeline schedule, bf16 weights and gradients, fp32 Adam state, no ZeRO, memory sized at the
generated length itself (p95 = mean). A second table removes the ``5·a·s/h`` attention-score term
of the activation formula (what flash attention does), to show how much of the result hangs on it.

    python benchmarks/memory_breakdown.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

from nereus.cost.calibration import default_calibration
from nereus.cost.memory import MemoryBreakdown, memory_capacity_bytes, rank_memory, stage_memory
from nereus.spec.hardware import A100_64GB, ClusterSpec
from nereus.spec.job import JobSpec, Setup
from nereus.spec.model import LLAMA_3_1_8B
from nereus.spec.plan import Candidate

LAYOUTS = ((4, 2, 2), (4, 4, 1))  # (dp, tp, pp)
GEN_LENS = (2048, 4096)
PAPER = {((4, 2, 2), 2048): "fits", ((4, 2, 2), 4096): "OOM", ((4, 4, 1), 4096): "fits"}
PROMPT_LEN = 1024
GLOBAL_BATCH = 64
MICRO_BATCH = 1


def _setup(gen_len: int, flash: bool, dist_opt: bool = False) -> Setup:
    job = JobSpec(
        algorithm="ppo", mode="sync",
        models=tuple((r, LLAMA_3_1_8B) for r in ("actor", "critic", "reward", "reference")),
        global_batch=GLOBAL_BATCH, prompt_len=PROMPT_LEN, gen_len=gen_len,
        flash_attention=flash, distributed_optimizer=dist_opt,
    )
    return Setup(job, ClusterSpec(2, 8, A100_64GB))


def rows(
    recompute: bool, flash: bool, micro_batch: int = MICRO_BATCH, fp32_grads: bool = False,
    dist_opt: bool = False,
) -> list[dict[str, object]]:
    """One row per (gen length, layout); ``flash`` and ``dist_opt`` are options of the planner's
    model (``job.flash_attention``, ``job.distributed_optimizer``), ``fp32_grads`` a what-if
    computed here."""
    calib = default_calibration()
    out: list[dict[str, object]] = []
    for gen in GEN_LENS:
        setup = _setup(gen, flash, dist_opt)
        ms = setup.job.workflow.by_name("actor-train")
        cap = memory_capacity_bytes(setup)
        for dp, tp, pp in LAYOUTS:
            ga = GLOBAL_BATCH // (dp * micro_batch)
            c = Candidate("actor-train", tp, pp, dp, micro_batch, ga, recompute)
            best: MemoryBreakdown | None = None
            best_rank = 0
            for r in range(pp):
                b = rank_memory(setup, ms, c, calib, r)
                grads = 2 * b.grads_bytes if fp32_grads else b.grads_bytes
                b = MemoryBreakdown(b.weights_bytes, grads, b.optimizer_bytes, b.activations_bytes,
                                    b.kv_cache_bytes, b.workspace_bytes)
                if best is None or b.peak_bytes > best.peak_bytes:
                    best, best_rank = b, r
            assert best is not None
            mb = best
            if not fp32_grads:  # the planner's own number
                assert mb == stage_memory(setup, ms, c, calib)
            out.append({
                "layout": f"({dp},{tp},{pp})", "micro_batch": micro_batch,
                "pp_rank": best_rank, "gen_len": gen, "seq_len": setup.job.max_seq_len,
                "weights_gb": mb.weights_bytes / 1e9, "grads_gb": mb.grads_bytes / 1e9,
                "adam_gb": mb.optimizer_bytes / 1e9, "activations_gb": mb.activations_bytes / 1e9,
                "workspace_gb": mb.workspace_bytes / 1e9, "peak_gb": mb.peak_bytes / 1e9,
                "capacity_gb": cap / 1e9, "peak_over_capacity": mb.peak_bytes / cap, "model": "fits" if mb.peak_bytes <= cap else "OOM",
                "paper": PAPER.get(((dp, tp, pp), gen), "-"),
            })
    return out


def _table(title: str, data: list[dict[str, object]]) -> str:
    head = ("layout", "gen", "s", "pp rank", "weights", "grads", "Adam", "activ.", "workspace", "peak",
            "cap.", "peak/cap.", "model", "paper")
    lines = [title, "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in data:
        cells = [str(r["layout"]), str(r["gen_len"]), str(r["seq_len"]), str(r["pp_rank"])]
        cells += [f"{float(r[k]):.1f}" for k in ("weights_gb", "grads_gb", "adam_gb",  # type: ignore[arg-type]
                                                  "activations_gb", "workspace_gb", "peak_gb",
                                                  "capacity_gb")]
        cells += [f"{float(r['peak_over_capacity']):.2f}", str(r["model"]), str(r["paper"])]  # type: ignore[arg-type]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    variants = {
        "no recompute, DESIGN formula s·b·h·(34 + 5·a·s/h)/t (flash_attention: false)":
            rows(False, False),
        "no recompute, without the 5·a·s/h score term (flash attention, the default)":
            rows(False, True),
        "full recompute": rows(True, False),
        "flash attention and the distributed optimizer (Adam state over dp = 4)":
            rows(False, True, dist_opt=True),
        "what-if: micro-batch 2, no score term, fp32 gradients": rows(False, True, 2, True),
    }
    if args.json:
        print(json.dumps({"variants": variants}, indent=1))
        return 0
    print("GB = 1e9 bytes, most loaded GPU of one replica; capacity = 0.9 x 64 GB")
    for title, data in variants.items():
        print()
        print(_table(title, data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
