"""Tiny Hugging Face checkpoints written locally (transformers' ``save_pretrained`` and a BPE
trained with ``tokenizers``: :mod:`nereus.tools.tiny_checkpoint`), one per family the issue
names, for the checkpoint tests of every tier. Written once per test session into a shared
temporary folder (``checkpoint(name)`` gives its path)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from nereus.tools.tiny_checkpoint import LLAMA31_SCALING, TinyModel

# Llama-3.1 with rope scaling (untied, sharded into several files, eps 1e-5, base 500000),
# Qwen2 with its q/k/v bias and tied embeddings, Qwen3 with q/k norm and head_dim 16 ≠ 64/8,
# Mistral (one kv head, a sliding window longer than any test sequence), a Qwen2 reward model.
FAMILIES: dict[str, TinyModel] = {
    "llama31": TinyModel(family="llama", rope_scaling=LLAMA31_SCALING, rope_theta=500000.0,
                         norm_eps=1e-5, shard_bytes=60_000, seed=1),
    "qwen2-tied": TinyModel(family="qwen2", tie=True, seed=2),
    "qwen3": TinyModel(family="qwen3", heads=8, head_dim=16, ffn=96, seed=3),
    "mistral": TinyModel(family="mistral", heads=8, sliding_window=256, seed=4),
}
EXTRA: dict[str, TinyModel] = {
    "qwen2-reward": TinyModel(family="qwen2", head="score", seed=5),
    "llama31-bf16": TinyModel(family="llama", rope_scaling=LLAMA31_SCALING,
                              rope_theta=500000.0, norm_eps=1e-5, dtype="bfloat16",
                              shard_bytes=40_000, seed=6),
}
_ROOT = Path(os.environ.get("NEREUS_TEST_CHECKPOINTS", "")) if os.environ.get(
    "NEREUS_TEST_CHECKPOINTS") else Path(tempfile.gettempdir()) / f"nereus-hf-{os.getuid()}"


def checkpoint(name: str) -> Path:
    """The folder of tiny checkpoint ``name`` (written on first use; a half-written one is
    never reused: each is written aside and renamed)."""
    from nereus.tools.tiny_checkpoint import write

    model = {**FAMILIES, **EXTRA}[name]
    import hashlib

    from nereus.tools import tiny_checkpoint as tool

    key = repr((model, tool.CORPUS, tool.CHAT_TEMPLATE)).encode()
    digest = hashlib.sha256(key).hexdigest()[:10]
    path = _ROOT / f"{name}-{digest}"
    if not path.is_dir():
        _ROOT.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=_ROOT, prefix=f".{name}-"))
        tmp.rmdir()
        write(str(tmp), model)
        try:
            tmp.rename(path)
        except OSError:  # written meanwhile by another process: keep theirs
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return path
