"""The identity of a job's data: what a resumed or relaunched run must find unchanged to go on
with the same sample order (pure: a function of plain values).

Two runs with the same identity sample the same rows in the same order: the files' bytes
(sha256), the tokenizer's files, the keys, ``max_prompt_len``, ``chat_template`` and the order's
seed. A job fingerprint (checkpoint compatibility) can include it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def data_identity(train_sha256: str, val_sha256: str, tokenizer_sha256: str,
                  options: Mapping[str, Any]) -> str:
    """A hex sha256 of the data's identity. ``options``: ``DataOptions.to_dict()`` (paths are
    left out: the same bytes at another path are the same data)."""
    keep = {k: v for k, v in sorted(options.items()) if k not in ("train", "val", "tokenizer")}
    text = json.dumps({"train": train_sha256, "val": val_sha256, "tokenizer": tokenizer_sha256,
                       "options": keep}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
