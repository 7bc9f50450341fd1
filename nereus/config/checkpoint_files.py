"""Reading a Hugging Face checkpoint folder's metadata for the config (file read, no weights).

:func:`read_checkpoint` reads ``config.json``, ``model.safetensors.index.json`` (or the single
``model.safetensors``), the header of every safetensors file (tensor names, dtypes and shapes,
through the ``safetensors`` library, which maps the file and reads its header only),
``generation_config.json`` and ``tokenizer_config.json``. Every problem is one
:class:`~nereus.errors.ConfigError` naming the field that gave the folder: a missing or
unreadable folder, a folder without ``config.json`` or without safetensors weights (``*.bin``
only), a file the index names that is not there, a tensor the index places in a file whose
header lacks it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from nereus.config import files
from nereus.config.checkpoint import CheckpointFacts, HfTensorInfo
from nereus.errors import ConfigError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
JSON_LIMIT = "MAX_CHECKPOINT_JSON_BYTES"


def _json(field: str, directory: str, name: str, required: bool) -> Mapping[str, Any] | None:
    path = os.path.join(directory, name)
    if not required and not os.path.exists(path):
        return None
    try:
        text = files.read_text(path, field, f"checkpoint's {name}", JSON_LIMIT)
    except ConfigError as e:
        raise ConfigError(field, directory, f"{name}: {e.rule}") from None
    data = files.parse_json(text, field, path)
    if not isinstance(data, dict):
        raise ConfigError(field, directory, f"{name} must hold a JSON object")
    return MappingProxyType(data)


def _folder(field: str, directory: Any) -> tuple[str, tuple[str, ...]]:
    if not isinstance(directory, str) or not directory or "\0" in directory:
        raise ConfigError(field, directory, "must be the path of a Hugging Face checkpoint "
                          "folder")
    full = os.path.abspath(directory)
    try:
        info = os.stat(full)
    except FileNotFoundError:
        raise ConfigError(field, directory, "no such folder") from None
    except OSError as e:
        raise ConfigError(field, directory, f"cannot be read ({e.strerror or e})") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(field, directory, f"is {files.kind_of(info.st_mode)}, not a folder")
    try:
        names = tuple(sorted(n for n in os.listdir(full)
                             if os.path.isfile(os.path.join(full, n))))
    except OSError as e:
        raise ConfigError(field, directory, f"cannot be listed ({e.strerror or e})") from None
    return full, names


def _weight_map(field: str, directory: str, names: tuple[str, ...]) -> dict[str, str]:
    """tensor → file, from the index (else the single file's header, filled in later)."""
    if INDEX in names:
        index = _json(field, directory, INDEX, required=True) or {}
        wmap = index.get("weight_map")
        if not isinstance(wmap, Mapping) or not wmap or not all(
                isinstance(k, str) and isinstance(v, str) and os.path.basename(v) == v
                for k, v in wmap.items()):
            raise ConfigError(field, directory, f"{INDEX}: weight_map must map tensor names to "
                              "file names in the folder")
        for shard in sorted(set(wmap.values())):
            if shard not in names:
                raise ConfigError(field, directory, f"{INDEX} names {shard}, which is not in "
                                  "the folder")
        return dict(wmap)
    if SINGLE in names:
        return {}
    if any(n.endswith(".bin") for n in names):
        raise ConfigError(field, directory, "holds PyTorch *.bin weights only; Nereus reads "
                          "safetensors (save_pretrained(..., safe_serialization=True))")
    raise ConfigError(field, directory, f"has no {SINGLE} and no {INDEX}")


def _header(field: str, directory: str, name: str) -> list[HfTensorInfo]:
    try:
        from safetensors import safe_open
    except ImportError:
        raise ConfigError(field, directory, "reading checkpoints needs the safetensors package "
                          "(pip install 'nereus[hf]')") from None
    path = os.path.join(directory, name)
    try:
        with safe_open(path, framework="numpy") as fh:
            out = []
            for key in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                sl = fh.get_slice(key)
                out.append(HfTensorInfo(key, str(sl.get_dtype()),
                                        tuple(int(n) for n in sl.get_shape()), name))
            return out
    except OSError as e:
        raise ConfigError(field, directory, f"{name} cannot be read ({e.strerror or e})") from None
    except Exception as e:  # safetensors' own error: a truncated or corrupt header
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(field, directory, f"{name} is not a readable safetensors file "
                          f"({first[:160]})") from None


def read_checkpoint(field: str, directory: Any) -> CheckpointFacts:
    """The metadata of the checkpoint folder ``directory`` (given by config field ``field``)."""
    full, names = _folder(field, directory)
    if "config.json" not in names:
        raise ConfigError(field, directory, "has no config.json (not a Hugging Face checkpoint "
                          "folder)")
    config = _json(field, full, "config.json", required=True)
    assert config is not None
    wmap = _weight_map(field, full, names)
    shard_files = sorted(set(wmap.values())) if wmap else [SINGLE]
    tensors: list[HfTensorInfo] = []
    for name in shard_files:
        found = _header(field, full, name)
        if wmap:
            listed = {k for k, v in wmap.items() if v == name}
            present = {t.name for t in found}
            lost = sorted(listed - present)
            if lost:
                raise ConfigError(field, directory, f"{INDEX} places {lost[0]!r} in {name}, "
                                  "whose header lacks it")
            found = [t for t in found if t.name in listed]
        tensors += found
    return CheckpointFacts(
        directory=full, config=config, tensors=tuple(sorted(tensors, key=lambda t: t.name)),
        generation_config=_json(field, full, "generation_config.json", required=False),
        tokenizer_config=_json(field, full, "tokenizer_config.json", required=False),
        files=names)
