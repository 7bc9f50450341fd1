"""Megatron-core imported through nereus.engines.megatron_import: no TorchDynamo/Inductor and no
wandb or TensorBoard at import, torch.compile, wandb and TensorBoard as they were afterwards, models built as before.

Each check runs in a fresh interpreter (a child process): the import happens once per process.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = r"""
import json, sys
import torch
real_compile = torch.compile
from nereus.engines import megatron_model  # imports Megatron-core through megatron_import
import megatron.core.jit as jit
out = {
    "inductor": "torch._inductor" in sys.modules,
    "dynamo": "torch._dynamo" in sys.modules,
    "wandb_during": "wandb" in sys.modules,
    "tensorboard_during": "torch.utils.tensorboard" in sys.modules,
    "compile_restored": torch.compile is real_compile,
    "jit_fuser_compiles": jit.jit_fuser is real_compile,
}
def f(x):
    return x + 1
out["fuser_passes_through"] = jit.jit_fuser(f) is f
try:
    import wandb  # noqa: F401
    out["wandb_after"] = "imported"
except ImportError:
    out["wandb_after"] = "not installed"
from torch.utils.tensorboard import SummaryWriter  # noqa: F401  (the tensorboard extra)
out["tensorboard_after"] = True
print(json.dumps(out))
"""


def _probe(code: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_megatron_imports_without_compiler_or_wandb_and_restores_both() -> None:
    out = _probe(PROBE)
    assert out["inductor"] is False and out["dynamo"] is False, out
    assert out["wandb_during"] is False and out["tensorboard_during"] is False, out
    assert out["tensorboard_after"] is True, out
    assert out["compile_restored"] is True, out
    assert out["jit_fuser_compiles"] is False and out["fuser_passes_through"] is True, out
    try:
        import importlib.util
        installed = importlib.util.find_spec("wandb") is not None
    except ValueError:
        installed = False
    assert out["wandb_after"] == ("imported" if installed else "not installed"), out


def test_wandb_imported_first_is_left_alone() -> None:
    pytest.importorskip("wandb")
    out = _probe("import wandb, sys, json\nw = sys.modules['wandb']\n"
                 "from nereus.engines import megatron_import\n"
                 "print(json.dumps({'same': sys.modules['wandb'] is w}))")
    assert out == {"same": True}


def test_a_model_built_after_the_import_matches_one_built_with_the_stock_import() -> None:
    """The same seed gives the same logits whether Megatron-core was imported through
    megatron_import or with torch.compile in place (the fusions the pass-through skips are off
    in every model Nereus builds, so nothing compiled was on the path)."""
    build = r"""
import json, os
import torch
if os.environ.get("STOCK") == "1":
    import megatron.core  # stock import first: jit_fuser is torch.compile
    import megatron.core.jit as jit
    assert jit.jit_fuser is torch.compile
import torch.distributed as dist
from nereus.engines.megatron_model import StageGroups, build_gpt
from nereus.spec.model import TINY_GPT
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
w = dist.group.WORLD
model = build_gpt(TINY_GPT, 1, 1, 0, StageGroups(w, w, w, w, w), seed=0)
ids = torch.arange(8).view(1, 8) % TINY_GPT.vocab_size
pos = torch.arange(8).view(1, 8)
with torch.no_grad():
    logits = model(ids, pos, None)
print(json.dumps({"sum": float(logits.double().sum()), "first": logits.flatten()[:8].tolist()}))
"""
    import os

    outs = []
    for stock in ("0", "1"):
        env = dict(os.environ, STOCK=stock)
        done = subprocess.run([sys.executable, "-W", "ignore", "-c", build], capture_output=True,
                              text=True, timeout=300, check=False, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        outs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert outs[0] == outs[1]
