"""The special tokens of a run's tokenizer, derived once (one rule for a tokenizer folder and a
checkpoint's), and a response's ids up to its first EOS.

The RL step left-pads prompts with ``pad_id`` (the padding masked out of attention:
:mod:`nereus.engines.masks`), generates until any of the ``eos_ids`` and scores responses on
their decoded text (:class:`nereus.rl.data.tokenizer.TextCodec`, the one codec of a run: the
tokenizer of ``data.tokenizer`` or of the actor's checkpoint folder; the pattern task ships its
own tokenizer folder like any user's).

:func:`special_tokens_of` is the rule, as verl and TRL read a checkpoint:

- EOS: every id ``generation_config.json`` names (``eos_token_id``, an id or a list: Qwen's
  instruct models stop at ``<|im_end|>`` and ``<|endoftext|>``), then the tokenizer's own
  ``eos_token``, then ``config.json``'s; generation stops at any of them;
- PAD: the tokenizer's ``pad_token``, else ``generation_config.json``'s or ``config.json``'s
  ``pad_token_id``, else the first EOS id;
- BOS: the tokenizer's, if any.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SpecialTokens:
    """The ids generation and padding use: every EOS id (a response stops at the first it
    samples), the PAD id (left padding of prompts, filler after EOS), the BOS id if any."""

    eos_ids: tuple[int, ...]
    pad_id: int
    bos_id: int | None = None

    def __post_init__(self) -> None:
        if not self.eos_ids:
            raise ValueError("at least one EOS id is needed")


def id_list(value: Any) -> list[int]:
    """The token ids of a config value (an id, a list of them, or anything else: none)."""
    items = value if isinstance(value, list) else [value]
    return [int(v) for v in items if isinstance(v, int) and not isinstance(v, bool) and v >= 0]


def special_tokens_of(tokenizer_eos: int | None, tokenizer_pad: int | None,
                      tokenizer_bos: int | None, generation_config: Mapping[str, Any] | None,
                      config: Mapping[str, Any] | None) -> SpecialTokens | None:
    """EOS, PAD and BOS by the module's rule from the tokenizer's own ids and the folder's
    ``generation_config.json`` and ``config.json`` (None where absent); None when no EOS id
    is named anywhere."""
    gen, cfg = dict(generation_config or {}), dict(config or {})
    eos: list[int] = []
    for ids in (id_list(gen.get("eos_token_id")), id_list(tokenizer_eos),
                id_list(cfg.get("eos_token_id"))):
        eos += [i for i in ids if i not in eos]
    if not eos:
        return None
    pads = (id_list(tokenizer_pad) or id_list(gen.get("pad_token_id"))
            or id_list(cfg.get("pad_token_id")) or eos[:1])
    bos = id_list(tokenizer_bos)
    return SpecialTokens(tuple(eos), pads[0], bos[0] if bos else None)


def response_ids(ids: Sequence[int], special: SpecialTokens) -> list[int]:
    """A response's ids up to its first EOS (excluded)."""
    out = []
    for t in ids:
        if int(t) in special.eos_ids:
            break
        out.append(int(t))
    return out
