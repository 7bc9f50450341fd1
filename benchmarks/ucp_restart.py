"""DeepSpeed's Universal Checkpoint restart: the baseline a live ZeRO DP change is measured
against (effectful; the paper's UCP). It lives with the benchmarks, not in the package: it
reads DeepSpeed's checkpoint files with ``torch.load`` (unpickling), which the runtime never does
(docs/security.md).

Three steps, each DeepSpeed's own: ``engine.save_checkpoint`` in the running job (every DP rank
writes its ZeRO partition), ``deepspeed.checkpoint.ds_to_universal`` (a separate process: one
file per parameter and state, independent of the DP degree), then fresh processes build the
unit at the new DP with ``checkpoint.load_universal`` and call ``engine.load_checkpoint``. The
unit's counters travel as the checkpoint's client state.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from nereus.engines.deepspeed_engine import DeepSpeedOptions, ZeroUnit
from nereus.errors import TransitionError

TAG = "nereus"
CLIENT_KEY = "nereus_counters"


def save(unit: ZeroUnit, path: str, tag: str = TAG) -> None:
    """DeepSpeed's checkpoint of ``unit`` (every DP rank calls it; DeepSpeed's barriers are
    over the whole job, so the job's ranks must be the unit's)."""
    c = unit.counters
    state = {} if c is None else {CLIENT_KEY: [c.updates, c.model_stage_version,
                                               c.policy_version, c.position]}
    unit.engine.save_checkpoint(path, tag=tag, client_state=state)


def _drop_empty_extra_state(path: str, tag: str) -> None:
    """Megatron-core modules put ``<module>._extra_state`` entries (None here: Transformer
    Engine's FP8 metadata, unused) into the state dict; ds_to_universal 0.19 calls ``.float()``
    on every entry of the model-state files, so the None entries are dropped first."""
    import glob

    import torch

    for f in glob.glob(os.path.join(path, tag, "*model_states.pt")):
        sd = torch.load(f, map_location="cpu", weights_only=False)
        module = sd.get("module") or {}
        empty = [k for k, v in module.items() if v is None]
        if empty:
            for k in empty:
                del module[k]
            torch.save(sd, f)


def to_universal(path: str, out: str, tag: str = TAG, workers: int = 1) -> None:
    """``ds_to_universal`` from ``path/tag`` into ``out/tag`` (a subprocess, as users run it)."""
    _drop_empty_extra_state(path, tag)
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
           "--input_folder", os.path.join(path, tag), "--output_folder", os.path.join(out, tag),
           "--num_extract_workers", str(workers), "--num_merge_workers", str(workers),
           "--inject_missing_state"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        raise TransitionError(f"ds_to_universal failed ({res.returncode}): {tail[0]}")
    with open(os.path.join(out, "latest_universal"), "w") as f:
        f.write(tag)


def universal_options(options: DeepSpeedOptions) -> DeepSpeedOptions:
    """The same unit config, loading universal checkpoints."""
    extra = dict(options.config)
    ckpt = dict(extra.get("checkpoint", {}) or {})
    ckpt["load_universal"] = True
    extra["checkpoint"] = ckpt
    return DeepSpeedOptions(options.zero_stage, tuple(sorted(extra.items())))


def load(unit: ZeroUnit, out: str, tag: str = TAG) -> None:
    """Load the universal checkpoint into ``unit`` (built with :func:`universal_options`)."""
    _, client = unit.engine.load_checkpoint(out, tag=tag, load_optimizer_states=True,
                                            load_lr_scheduler_states=False)
    counters: Any = (client or {}).get(CLIENT_KEY)
    if counters is not None and unit.counters is not None:
        c = unit.counters
        c.updates, c.model_stage_version, c.policy_version, c.position = counters
