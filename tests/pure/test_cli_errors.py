"""Shell: bad command lines and bad config files end in one stderr line and exit 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli_cases import EXAMPLE, fill_argv, write_bad_files

from nereus.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "ppo-tiny-cpu.yaml")


@pytest.fixture
def bad_files(tmp_path: Path) -> dict[str, str]:
    return write_bad_files(tmp_path)


# (argv, a fragment the single error line must contain). "{name}" is a file from ``bad_files``.
BAD_CALLS: list[tuple[list[str], str]] = [
    ([], "required: COMMAND"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["plan", "--bogus"], "unrecognized arguments: --bogus"),
    (["plan", "--gpus", "12", "--gpus-per-node", "8"],
     "--gpus=12: must be a positive multiple of --gpus-per-node=8"),
    (["plan", "--gpus", "0"], "--gpus=0: must be a positive multiple"),
    (["plan", "--gpus", "-8"], "--gpus=-8: must be a positive multiple"),
    (["plan", "--gpus", "sixty-four"], "argument --gpus: invalid int value: 'sixty-four'"),
    (["plan", "--gpus-per-node", "0", "--gpus", "8"], "--gpus-per-node=0: must be a positive"),
    (["plan", "--gpu", "h100"], "--gpu='h100': unknown GPU preset; did you mean 'h200'?"),
    (["plan", "--model", "llama-8b"], "--model='llama-8b': unknown model preset"),
    (["plan", "--model", "tiny-gpt"], "job.gen_len=2048: prompt_len + gen_len = 3072 tokens"),
    (["plan", "--algo", "dpo"], "argument --algo: invalid choice: 'dpo'"),
    (["plan", "--mode", "overlap"], "argument --mode: invalid choice: 'overlap'"),
    (["plan", "--search", "greedy"], "argument --search: invalid choice: 'greedy'"),
    (["plan", "--seq-len", "0"], "--seq-len=0: must be a positive integer"),
    (["plan", "--prompt-len", "-3"], "--prompt-len=-3: must be a positive integer"),
    (["plan", "--global-batch", "0"], "--global-batch=0: must be a positive integer"),
    (["plan", TINY, "--seq-len", "1000"], "--seq-len=1000: prompt_len + gen_len = 1008 tokens"),
    (["plan", TINY, "--global-batch", "3"],
     "job.minibatches=4: must divide global_batch × samples_per_prompt = 3"),
    (["plan", "{missing}"], "no such file"),
    (["plan", "{dir}"], "is a directory"),
    (["plan", "{invalid}"], "not valid YAML"),
    (["plan", "{list}"], "is a list; must be a YAML mapping"),
    (["plan", "{zero_gpus}"], "cluster.gpus_per_node=0: must be a positive integer"),
    (["plan", "{grpo_critic}", "--model", "qwen3-14b"], "models.critic='llama-3.1-8b': not used: grpo"),
    (["plan", "{zero_gpus}", "--gpus", "16"], "cluster.gpus_per_node=0"),
    (["config"], "required: ACTION"),
    (["config", "check"], "required: FILE"),
    (["config", "check", EXAMPLE, EXAMPLE], "unrecognized arguments"),
    (["config", "verify", EXAMPLE], "invalid choice: 'verify'"),
    (["config", "check", "{missing}"], "no such file"),
    (["config", "check", "{dir}"], "is a directory"),
    (["config", "check", "{invalid}"], "not valid YAML: "),
    (["config", "check", "{unknown_key}"], "cluster.gpu_per_node=8: unknown key; did you mean"),
    (["config", "check", "{zero_gpus}"], "cluster.gpus_per_node=0"),
]


@pytest.mark.parametrize(("argv", "fragment"), BAD_CALLS, ids=[" ".join(a) for a, _ in BAD_CALLS])
def test_bad_call_is_one_line_exit_2(
    argv: list[str], fragment: str, bad_files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(fill_argv(argv, bad_files))
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("nereus: error: ")
    assert fragment in lines[0]


def test_there_are_enough_bad_calls() -> None:
    assert len(BAD_CALLS) >= 10


def test_config_check_ok_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", EXAMPLE]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        f"OK {EXAMPLE}: ppo sync, 6 model-stages (actor-gen, ref-inf, reward-inf, critic-inf, "
        "actor-train, critic-train), 64 GPUs (8 nodes × 8 h200, 141 GB each)"
    ]


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_example_passes_config_check(path: Path, capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    from support.hf_checkpoints import example_on_a_checkpoint

    path = example_on_a_checkpoint(path, tmp_path)  # the checkpoint the example names, made
    capsys.readouterr()
    assert main(["config", "check", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"OK {path}: ")
