"""YAML text → data (``yaml.safe_load``, duplicate keys rejected) and the one function that reads
a config file. Everything else in ``nereus.config`` works on already-parsed data.

PyYAML is imported inside the two functions that parse text, so the rest of the package (and the
pure core importing it) stays standard-library only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nereus.config.cluster import uses_auto_gpu
from nereus.config.schema import EXTENSION_SECTIONS, Config, describe, parse_config
from nereus.errors import ConfigError

if TYPE_CHECKING:
    import yaml

    from nereus.spec.hardware import GpuSpec


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "?"


def _check_unique_keys(node: yaml.Node, path: str) -> None:
    """Reject a mapping that names one key twice (``safe_load`` would keep the last silently)."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            at = f"{path}.{key}" if path else key
            if key in first_line:
                shown = value_node.value if isinstance(value_node, yaml.ScalarNode) else "..."
                raise ConfigError(
                    at, shown, f"duplicate key at {_where(key_node.start_mark)} "
                    f"(first at line {first_line[key]})",
                )
            first_line[key] = key_node.start_mark.line + 1
            _check_unique_keys(value_node, at)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_unique_keys(item, f"{path}[{i}]")


def parse_yaml(text: str, source: str = "config") -> Any:
    """One YAML document as plain data; syntax errors become one-line ``ConfigError``s."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is not None:
            _check_unique_keys(root, "")
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        parts = [str(p) for p in (exc.context, exc.problem) if p] or ["syntax error"]
        problem = " ".join(" ".join(parts).split())
        where = _where(exc.problem_mark)
        raise ConfigError("config", source, f"not valid YAML: {problem} at {where}") from None
    except yaml.YAMLError as exc:
        problem = " ".join(str(exc).split())
        raise ConfigError("config", source, f"not valid YAML: {problem}") from None


def read_text(path: str) -> str:
    """The file's text; a missing, unreadable or binary file is a ``ConfigError``."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise ConfigError("config", path, "no such file") from None
    except IsADirectoryError:
        raise ConfigError("config", path, "is a directory, not a YAML file") from None
    except PermissionError:
        raise ConfigError("config", path, "cannot be read (permission denied)") from None
    except UnicodeDecodeError:
        raise ConfigError("config", path, "is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError("config", path, f"cannot be read ({exc.strerror or exc})") from None


def load_raw(path: str) -> dict[str, Any]:
    """The file's top-level mapping, not yet checked (callers may overlay CLI flags first)."""
    data = parse_yaml(read_text(path), path)
    if not isinstance(data, dict):
        raise ConfigError(
            "config", path, f"is {describe(data)}; must be a YAML mapping with sections "
            "job, models, cluster, controller",
        )
    return data


def load_config(path: str, *, extensions: tuple[str, ...] = EXTENSION_SECTIONS,
                detect_gpu: Callable[[], GpuSpec] | None = None) -> Config:
    """Read, parse and check the YAML config at ``path``; ``detect_gpu`` (the shell's inventory
    reader) is called only when the config says ``cluster.gpu: auto``."""
    raw = load_raw(path)
    detected = detect_gpu() if detect_gpu is not None and uses_auto_gpu(raw) else None
    return parse_config(raw, extensions=extensions, detected_gpu=detected)
