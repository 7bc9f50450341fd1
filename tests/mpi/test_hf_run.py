"""``nereus run`` with Hugging Face checkpoints, as a user runs it (mpiexec, 4 CPU ranks).

A tiny Llama-3.1 checkpoint (tests/support/hf_checkpoints.py) is the actor and the critic's
trunk; the plan changes live so actor-train ends at tp=2 and critic-train at pp=2; the run
exports every 2 steps and at its end (``runtime.save_hf``). transformers' ``from_pretrained``
loads each export with no missing or unexpected keys and gives the logits (values) of the final
units (``runtime.save_state``); every rank's bytes read equal its shards' bytes under the
initial plan. A preempted run exports at the boundary it stops at; its requeued job
continues into the same folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.hf_checkpoints import checkpoint
from support.paths import REPO
from support.preempt_runs import run_and_signal
from support.run_jobs import nereus

pytestmark = pytest.mark.slow
REL_TOL = 1e-5


def _job(tmp: Path, steps: int, runtime: str, name: str = "job.yaml") -> Path:
    ck = checkpoint("llama31")
    cfg = tmp / name
    cfg.write_text(f"""
job: {{algorithm: ppo, global_batch: 8, minibatches: 2, prompt_len: 8, gen_len: 8,
      gen_len_p95: 16, reward_model: false, dtype_bytes: 4}}
models: {{actor: {{checkpoint: {ck}}}, critic: {{checkpoint: {ck}}}}}
cluster: {{nodes: 1, gpus_per_node: 4, gpu: cpu, memory_per_gpu_gb: 0.5}}
runtime: {{steps: {steps}, max_new_tokens: 12, lr: 0.001, timeout_s: 120, {runtime}}}
""")
    return cfg


def _final_unit(spec: Any, arrays: dict[str, np.ndarray]) -> Any:
    import torch.distributed as dist

    from nereus.emu.unit import Emu, Layout
    from nereus.runtime.execution.groups import unit_groups
    from nereus.runtime.worker.state import load_global, new_unit_state

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    emu = Emu("x", "x", Layout(1, 1), (0,))
    groups = unit_groups(emu, 0, 30.0)
    st = new_unit_state(spec, emu, 0, groups)
    zeros = {k: np.zeros_like(v) for k, v in arrays.items()}
    load_global(st, {"param": arrays, "exp_avg": zeros, "exp_avg_sq": zeros})
    return st


def test_a_run_on_checkpoints_exports_what_transformers_loads(tmp_path: Path) -> None:
    import transformers

    from nereus.config.load import load_config
    from nereus.emu.shards import shards_at
    from nereus.emu.unit import Layout
    from nereus.log.reader import read_run_log
    from nereus.runtime.worker.train import unit_logits
    from nereus.spec.plan import ExecutionPlan

    out, npz, log = tmp_path / "out", tmp_path / "final.npz", tmp_path / "run.h5"
    cfg = _job(tmp_path, 3, f"save_state: {npz}, save_hf: {{dir: {out}, every: 2, roles: "
               "[critic]}, force_transitions: [{at_step: 0, layouts: {actor-train: [2, 1], "
               "critic-train: [1, 2]}}]")
    done = nereus("run", str(cfg), "--log", str(log), timeout_s=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["step-000002", "step-000003"]
    r = read_run_log(log)
    final_plan = json.loads(r.tables["transitions"]["plan"][-1]) if isinstance(
        r.tables["transitions"]["plan"][-1], str) else r.tables["transitions"]["plan"][-1]
    layouts = {s["name"]: (s["tp"], s["pp"]) for s in final_plan["stages"]}
    assert layouts["actor-train"] == (2, 1) and layouts["critic-train"] == (1, 2)

    setup = load_config(str(cfg)).setup
    z = np.load(npz)
    tokens = torch.randint(0, 300, (3, 14), generator=torch.Generator().manual_seed(2))
    for role, cls in (("actor", "AutoModelForCausalLM"),
                      ("critic", "AutoModelForTokenClassification")):
        stage = f"{role}-train"
        arrays = {k.split("/", 2)[2]: z[k] for k in z.files if k.startswith(f"{stage}/param/")}
        ours = unit_logits(_final_unit(setup.job.model(role), arrays), tokens)
        model, info = getattr(transformers, cls).from_pretrained(
            str(out / "step-000003" / role), output_loading_info=True)
        assert not any(info.values()), info  # no missing, unexpected or mismatched keys
        with torch.no_grad():
            ref = model.float().eval()(input_ids=tokens).logits
        assert ours is not None
        ours = ours if role == "actor" else ours[..., :1]
        assert float((ours - ref).abs().max()) <= REL_TOL * float(ref.abs().max()), role

    loads = [d for k, d in zip(r.events["kind"], r.events["detail"], strict=True)
             if k == "checkpoint-load"]
    assert len(loads) == 1
    read = loads[0]
    plan = ExecutionPlan.from_dict(r.initial_plan)
    for role in ("actor", "reference", "critic"):
        spec = setup.job.model(role)
        for rank in range(4):
            want = 0
            for sp in plan.stages:
                if setup.job.workflow.by_name(sp.name).role != role:
                    continue
                for rep in sp.replicas:
                    if rank in rep:
                        pp_rank, tp_rank = divmod(rep.index(rank), sp.tp)
                        head_free = [s for s in shards_at(spec, Layout(sp.tp, sp.pp), pp_rank,
                                                          tp_rank)
                                     if role != "critic" or s.tensor != "output_layer.weight"]
                        want += sum(int(np.prod(s.local_shape)) * 4 for s in head_free)
            assert read[role]["bytes_read"].get(str(rank), 0) == want, (role, rank)


def test_a_preempted_run_exports_at_the_boundary_it_stops_at(tmp_path: Path) -> None:
    """... and its requeued job (``SLURM_RESTART_COUNT`` 1, no ``--resume``: it resumes by
    itself) continues into the same export folder — not refused as a fresh run's non-empty
    one — leaves the earlier export as it was and exports at its end."""
    import transformers

    out, log = tmp_path / "out", tmp_path / "run.h5"
    cfg = _job(tmp_path, 6, f"adapt: false, save_hf: {{dir: {out}}}")
    code, text = run_and_signal([str(cfg), "--log", str(log), "--ranks", "4"],
                                signal.SIGUSR1, after_step=1)
    assert code == 75, text[-3000:]
    steps = sorted(p.name for p in out.iterdir())
    assert len(steps) == 1 and steps[0] != "step-000006", steps
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary left
    _, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(out / steps[0] / "actor"), output_loading_info=True)
    assert not any(info.values()), info
    before = {p: p.read_bytes() for p in (out / steps[0]).rglob("*") if p.is_file()}

    env = {**os.environ, "SLURM_RESTART_COUNT": "1"}
    done = subprocess.run([sys.executable, "-m", "nereus", "run", str(cfg), "--log", str(log),
                           "--ranks", "4"], capture_output=True, text=True, timeout=1500,
                          cwd=REPO, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "resuming from" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == [steps[0], "step-000006"]
    assert {p: p.read_bytes() for p in (out / steps[0]).rglob("*") if p.is_file()} == before
    _, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(out / "step-000006" / "actor"), output_loading_info=True)
    assert not any(info.values()), info
