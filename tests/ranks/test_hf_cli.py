"""Hugging Face checkpoints at the command line (the CLI as a child process): ``nereus plan``
plans a checkpoint's architecture; a bad checkpoint or export folder, as a user meets it, makes
``nereus config check`` and ``nereus run`` print one line naming the field, exit 2 and create
nothing — no log, no export folder — before any rank starts.

Each case is a copy of a tiny checkpoint (tests/support/hf_checkpoints.py) broken one way: a
missing folder, a file the index names removed, a tensor of the wrong shape (rewritten with
safetensors), a tokenizer larger than config.json's vocabulary, a mixture-of-experts config.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from support.hf_checkpoints import checkpoint
from support.run_jobs import nereus


def _job(tmp: Path, ck: Path, runtime: str = "") -> Path:
    cfg = tmp / "job.yaml"
    cfg.write_text(f"""
job: {{algorithm: grpo, global_batch: 4, samples_per_prompt: 2, prompt_len: 8, gen_len: 8,
      reward_model: false, dtype_bytes: 4}}
models: {{actor: {{checkpoint: {ck}}}}}
cluster: {{nodes: 1, gpus_per_node: 2, gpu: cpu, memory_per_gpu_gb: 0.5}}
runtime: {{steps: 2, {runtime}}}
""")
    return cfg


def _copy(tmp: Path) -> Path:
    dst = tmp / "ck"
    shutil.copytree(checkpoint("llama31"), dst)
    return dst


def _drop_shard(ck: Path) -> None:
    index = json.loads((ck / "model.safetensors.index.json").read_text())
    (ck / sorted(set(index["weight_map"].values()))[-1]).unlink()


def _misshape(ck: Path) -> None:
    from safetensors.torch import load_file, save_file

    index = json.loads((ck / "model.safetensors.index.json").read_text())
    name = "model.layers.1.mlp.down_proj.weight"
    path = ck / index["weight_map"][name]
    tensors = load_file(str(path))
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, str(path), metadata={"format": "pt"})


def _small_vocab(ck: Path) -> None:
    cfg = json.loads((ck / "config.json").read_text())
    cfg["vocab_size"] = 200  # the tokenizer has about 300 tokens; the tensors change too
    (ck / "config.json").write_text(json.dumps(cfg))


def _vocab_only_tokenizer(ck: Path) -> None:
    """The tokenizer grows past the vocabulary (added tokens), the weights stay right."""
    tok = json.loads((ck / "tokenizer.json").read_text())
    first = len(tok["model"]["vocab"])
    tok["added_tokens"] += [{"id": first + i, "content": f"<|extra_{i}|>", "single_word": False,
                             "lstrip": False, "rstrip": False, "normalized": False,
                             "special": True} for i in range(100)]
    (ck / "tokenizer.json").write_text(json.dumps(tok))


def _moe(ck: Path) -> None:
    cfg = json.loads((ck / "config.json").read_text())
    cfg.update(model_type="qwen3_moe", num_experts=8)
    (ck / "config.json").write_text(json.dumps(cfg))


CASES: list[tuple[str, Callable[[Path], None] | None, str]] = [
    ("missing folder", None, "no such folder"),
    ("shard missing from the index", _drop_shard, "which is not in the folder"),
    ("wrong shape", _misshape, "has shape"),
    ("config vocabulary below the tensors", _small_vocab, "has shape"),
    ("tokenizer larger than the vocabulary", _vocab_only_tokenizer, "cannot embed them"),
    ("mixture of experts", _moe, "mixture-of-experts"),
]


@pytest.mark.parametrize(("case", "edit", "rule"), CASES, ids=[c[0] for c in CASES])
def test_config_check_refuses_a_bad_checkpoint_in_one_line(tmp_path: Path, case: str,
                                                           edit: Callable[[Path], None] | None,
                                                           rule: str) -> None:
    ck = tmp_path / "absent"
    if edit is not None:
        ck = _copy(tmp_path)
        edit(ck)
    res = nereus("config", "check", str(_job(tmp_path, ck)), timeout_s=300)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "models.actor.checkpoint" in lines[0] and rule in lines[0], \
        res.stderr


def test_run_refuses_before_any_rank_and_creates_nothing(tmp_path: Path) -> None:
    ck = _copy(tmp_path)
    _misshape(ck)
    out, log = tmp_path / "out", tmp_path / "run.h5"
    res = nereus("run", str(_job(tmp_path, ck, f"save_hf: {{dir: {out}}}")), "--log", str(log),
                 timeout_s=300)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not log.exists() and not out.exists()


def test_run_never_exports_into_a_folder_that_holds_something(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "step-000002").mkdir()
    log = tmp_path / "run.h5"
    res = nereus("run", str(_job(tmp_path, checkpoint("llama31"), f"save_hf: {{dir: {out}}}")),
                 "--log", str(log), timeout_s=300)
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip().splitlines()
    assert len(line) == 1 and "runtime.save_hf.dir" in line[0] and "not empty" in line[0]
    assert not log.exists() and sorted(p.name for p in out.iterdir()) == ["step-000002"]


def test_plan_plans_the_checkpoints_architecture(tmp_path: Path) -> None:
    """``nereus plan`` on a checkpoint gives the plan of the same architecture written out by
    hand (config.json's fields as an explicit architecture)."""
    from dataclasses import asdict

    from nereus.config.checkpoint import role_checkpoint
    from nereus.config.checkpoint_files import read_checkpoint

    ck = checkpoint("llama31")
    spec = role_checkpoint("models.actor", "actor", read_checkpoint("ck", str(ck))).spec
    arch = {k: v for k, v in asdict(spec).items() if k != "rope_scaling"}
    arch["rope_scaling"] = {"type": "llama3", **{k: v for k, v in asdict(
        spec.rope_scaling).items() if k != "kind"}} if spec.rope_scaling else None
    import yaml

    by_hand = tmp_path / "by_hand.yaml"
    by_hand.write_text(_job(tmp_path, ck).read_text().replace(  # YAML: 1e-05 is a string
        f"{{checkpoint: {ck}}}", yaml.safe_dump(arch, default_flow_style=True).strip()))
    got = []
    for p in (_job(tmp_path, ck), by_hand):
        res = nereus("plan", str(p), "--json", timeout_s=300)
        assert res.returncode == 0, res.stderr
        got.append(json.loads(res.stdout))
    stages = [[(s["name"], s["tp"], s["pp"], s["dp"], s["peak_bytes"]) for s in g["model_stages"]]
              for g in got]
    assert stages[0] and stages[0] == stages[1]
