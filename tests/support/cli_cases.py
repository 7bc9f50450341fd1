"""Bad config files for the CLI error tests (pure/test_cli_errors.py in-process,
ranks/test_cli_entry.py through the console entry)."""

from __future__ import annotations

from pathlib import Path

from support.paths import REPO

EXAMPLE = str(REPO / "examples" / "ppo-llama8b-h200.yaml")


def write_bad_files(folder: Path) -> dict[str, str]:
    """Files that each break one rule, by name; ``dir`` (a folder) and ``missing`` (no file)."""
    files = {
        "invalid": "job: [1, 2\n",
        "unknown_key": Path(EXAMPLE).read_text().replace("gpus_per_node: 8", "gpu_per_node: 8"),
        "zero_gpus": Path(EXAMPLE).read_text().replace("gpus_per_node: 8", "gpus_per_node: 0"),
        "list": "- 1\n- 2\n",
        "grpo_critic": Path(EXAMPLE).read_text().replace("algorithm: ppo", "algorithm: grpo"),
    }
    out = {}
    for name, text in files.items():
        path = folder / f"{name}.yaml"
        path.write_text(text)
        out[name] = str(path)
    out["dir"] = str(folder)
    out["missing"] = str(folder / "missing.yaml")
    return out


def fill_argv(template: list[str], files: dict[str, str]) -> list[str]:
    """``template`` with each ``{name}`` replaced by that file of :func:`write_bad_files`."""
    return [a.format(**files) if a.startswith("{") else a for a in template]
