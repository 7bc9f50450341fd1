"""Shell: ``nereus plan`` — flags over the config, the table, ``--json`` and infeasibility."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from nereus.cli import build_parser, main
from nereus.commands.plan import build_setup
from nereus.spec.hardware import GPU_PRESETS
from nereus.spec.model import MODEL_PRESETS

ROOT = Path(__file__).resolve().parents[2]
H200_EXAMPLE = str(ROOT / "examples" / "ppo-llama8b-h200.yaml")
GRPO_EXAMPLE = str(ROOT / "examples" / "grpo-qwen3-14b-mi250x.yaml")
TINY = str(ROOT / "examples" / "ppo-tiny-cpu.yaml")
DONE_WHEN = ["plan", "--model", "llama-3.1-8b", "--gpu", "h200", "--gpus", "64",
             "--gpus-per-node", "8", "--seq-len", "4096", "--algo", "ppo"]


def args_of(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["plan", *argv])


# ---- flags over the config (no planner needed) ------------------------------------------------

def test_builtin_job_without_config() -> None:
    setup = build_setup(args_of())
    job = setup.job
    assert (job.algorithm, job.mode, job.global_batch, job.prompt_len, job.gen_len) == (
        "ppo", "sync", 256, 1024, 2048,
    )
    assert not job.reward_model
    assert job.workflow.names == ("actor-gen", "ref-inf", "critic-inf", "actor-train",
                                  "critic-train")
    assert {r for r, _ in job.models} == {"actor", "critic", "reference"}
    assert setup.cluster.num_gpus == 8 and setup.cluster.gpu == GPU_PRESETS["h200"]


def test_done_when_flags_build_the_intended_setup() -> None:
    setup = build_setup(args_of(*DONE_WHEN[1:]))
    assert (setup.cluster.nodes, setup.cluster.gpus_per_node) == (8, 8)
    assert setup.job.gen_len == 4096 and setup.job.prompt_len == 1024
    assert all(m == MODEL_PRESETS["llama-3.1-8b"] for _, m in setup.job.models)


def test_model_flag_sets_actor_critic_reference_but_not_reward() -> None:
    setup = build_setup(args_of(H200_EXAMPLE, "--model", "qwen3-14b"))
    models = dict(setup.job.models)
    assert models["actor"] == models["critic"] == models["reference"] == MODEL_PRESETS["qwen3-14b"]
    assert models["reward"] == MODEL_PRESETS["llama-3.1-8b"]


def test_gpus_flag_keeps_the_config_gpus_per_node() -> None:
    setup = build_setup(args_of(TINY, "--gpus", "12"))
    assert (setup.cluster.nodes, setup.cluster.gpus_per_node) == (3, 4)
    assert setup.cluster.gpu.memory_bytes == 500_000_000  # the config's override stays


def test_gpu_flag_drops_the_hardware_overrides_of_the_config() -> None:
    setup = build_setup(args_of(TINY, "--gpu", "a100-64gb"))
    assert setup.cluster.gpu == GPU_PRESETS["a100-64gb"]


def test_algo_flag_drops_or_adds_the_critic() -> None:
    grpo = build_setup(args_of(H200_EXAMPLE, "--algo", "grpo")).job
    assert grpo.algorithm == "grpo" and "critic" not in dict(grpo.models)
    assert grpo.samples_per_prompt == 8
    ppo = build_setup(args_of(GRPO_EXAMPLE, "--algo", "ppo")).job
    assert dict(ppo.models)["critic"] == MODEL_PRESETS["qwen3-14b"]


def test_seq_len_is_the_generated_length_and_drops_the_p95() -> None:
    job = build_setup(args_of(GRPO_EXAMPLE, "--seq-len", "1024", "--prompt-len", "256",
                              "--global-batch", "64", "--mode", "sync")).job
    assert (job.gen_len, job.gen_len_p95, job.prompt_len, job.global_batch, job.mode) == (
        1024, 0, 256, 64, "sync",
    )
    assert job.max_seq_len == 256 + 1024


# ---- planning (needs nereus.plan) ------------------------------------------------------------

def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    rc = main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert len(lines) == 1
    return rc, json.loads(lines[0])


def test_done_when_feasible_plan_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, obj = _json(DONE_WHEN, capsys)
    assert rc == 0 and obj["feasible"] is True
    names = [s["name"] for s in obj["model_stages"]]
    assert names == ["actor-gen", "ref-inf", "critic-inf", "actor-train", "critic-train"]
    for s in obj["model_stages"]:
        assert s["tp"] * s["pp"] * s["dp"] == len(s["gpus"])
        assert set(s["gpus"]) <= set(range(64)) and s["tp"] <= 8
    assert obj["predicted_step_s"] > 0 and obj["decision_ms"] > 0
    assert 0 < obj["peak_memory_bytes"] <= 0.9 * 141e9


def test_done_when_feasible_plan_as_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(DONE_WHEN) == 0
    out, err = capsys.readouterr()
    assert err == ""
    for name in ("actor-gen", "ref-inf", "critic-inf", "actor-train", "critic-train"):
        assert name in out
    assert "decision:" in out.splitlines()[-1]


def test_70b_on_4_gpus_is_infeasible_with_the_tightest_constraint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [*DONE_WHEN[:6], "4", *DONE_WHEN[7:]]
    argv[2] = "llama-3.3-70b"
    assert main(argv) == 3
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nereus: infeasible: ")
    assert "GB" in lines[0]
    rc, obj = _json(argv, capsys)
    assert rc == 3 and obj["feasible"] is False
    assert obj["reason"] in lines[0]


def test_flags_override_the_config_in_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    rc, obj = _json(["plan", H200_EXAMPLE, "--gpus", "16"], capsys)
    assert rc == 0
    assert all(max(s["gpus"]) < 16 for s in obj["model_stages"])
    assert "reward-inf" in [s["name"] for s in obj["model_stages"]]


def test_milp_search_agrees_with_dp_on_the_tiny_job(capsys: pytest.CaptureFixture[str]) -> None:
    _, dp = _json(["plan", TINY, "--gpus", "4"], capsys)
    _, exact = _json(["plan", TINY, "--gpus", "4", "--search", "milp"], capsys)
    assert dp["feasible"] and exact["feasible"]
    assert (dp["method"], exact["method"]) == ("dp", "milp")
    assert dp["predicted_step_s"] == pytest.approx(exact["predicted_step_s"], rel=1e-6)


def test_a_partial_node_plans_on_its_first_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    setup = build_setup(args_of("--gpus", "4", "--gpus-per-node", "8"))
    assert (setup.cluster.nodes, setup.cluster.gpus_per_node) == (1, 8)
    rc, obj = _json(["plan", TINY, "--gpus", "3"], capsys)
    assert rc == 0
    assert set().union(*(s["gpus"] for s in obj["model_stages"])) <= {0, 1, 2}


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_has_a_feasible_plan(
    path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from support.hf_checkpoints import example_on_a_checkpoint

    path = example_on_a_checkpoint(path, tmp_path)  # the checkpoint the example names, made
    capsys.readouterr()  # transformers' progress bars while writing it
    rc, obj = _json(["plan", str(path)], capsys)
    assert rc == 0 and obj["feasible"] is True, obj
    assert obj["peak_memory_bytes"] <= obj["capacity_bytes"]
