"""A checkpoint's tokenizer as the RL step's text codec (effectful: transformers).

:func:`load_codec` loads the tokenizer files of a checkpoint folder through transformers'
``AutoTokenizer`` (offline: only the folder is read) and derives the special tokens:

- EOS: every id ``generation_config.json`` names (``eos_token_id``, an id or a list: Qwen's
  instruct models stop at ``<|im_end|>`` and ``<|endoftext|>``), then the tokenizer's own
  ``eos_token``, then ``config.json``'s; generation stops at any of them;
- PAD: the tokenizer's ``pad_token`` (else ``generation_config.json``'s or ``config.json``'s
  ``pad_token_id``, else the first EOS id, as verl and TRL do);
- BOS: the tokenizer's, if any.

A tokenizer whose vocabulary does not fit the model's embedding (``len(tokenizer)`` above
``config.json``'s ``vocab_size``, or a special id outside it), a folder without tokenizer files
and a checkpoint with no EOS id at all are one-line :class:`~nereus.errors.ConfigError`\\ s.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from nereus.config.checkpoint import ModelCheckpoint
from nereus.errors import ConfigError
from nereus.rl.tokens import SpecialTokens

# the files of a tokenizer (and its generation settings) export copies beside the weights
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "generation_config.json")


def _id_list(value: Any) -> list[int]:
    items = value if isinstance(value, list) else [value]
    return [int(v) for v in items if isinstance(v, int) and not isinstance(v, bool) and v >= 0]


def special_tokens(ck: ModelCheckpoint, tokenizer: Any) -> SpecialTokens:
    """EOS, PAD and BOS of ``ck`` with its loaded ``tokenizer`` (see the module docstring)."""
    gen = dict(ck.facts.generation_config or {})
    cfg = dict(ck.facts.config)
    eos: list[int] = []
    for ids in (_id_list(gen.get("eos_token_id")), _id_list(tokenizer.eos_token_id),
                _id_list(cfg.get("eos_token_id"))):
        eos += [i for i in ids if i not in eos]
    field = f"models.{ck.role}.checkpoint"
    if not eos:
        raise ConfigError(field, ck.directory, "names no EOS id (generation_config.json, the "
                          "tokenizer and config.json have none)")
    pads = (_id_list(tokenizer.pad_token_id) or _id_list(gen.get("pad_token_id"))
            or _id_list(cfg.get("pad_token_id")) or eos[:1])
    bos = _id_list(tokenizer.bos_token_id)
    special = SpecialTokens(tuple(eos), pads[0], bos[0] if bos else None)
    vocab = ck.spec.vocab_size
    size = len(tokenizer)
    if size > vocab:
        raise ConfigError(field, ck.directory, f"its tokenizer has {size} tokens; config.json's "
                          f"vocab_size={vocab} cannot embed them")
    for name, i in (("EOS", max(eos)), ("PAD", special.pad_id)):
        if i >= vocab:
            raise ConfigError(field, ck.directory, f"{name} id {i} is outside config.json's "
                              f"vocab_size={vocab}")
    return special


class HfCodec:
    """A transformers tokenizer behind :class:`nereus.rl.tokens.TextCodec`."""

    ids_reward = False

    def __init__(self, tokenizer: Any, special: SpecialTokens, vocab_size: int) -> None:
        """``vocab_size``: the tokenizer's ids are below it (``len(tokenizer)``)."""
        self.tokenizer = tokenizer
        self.special = special
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer(text)["input_ids"]]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True))


def load_tokenizer(ck: ModelCheckpoint) -> Any:
    """transformers' tokenizer of ``ck``'s folder (offline)."""
    field = f"models.{ck.role}.checkpoint"
    if not any(name in ck.facts.files for name in ("tokenizer.json", "tokenizer.model",
                                                   "vocab.json")):
        raise ConfigError(field, ck.directory, "has no tokenizer (tokenizer.json, "
                          "tokenizer.model or vocab.json)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder: never the network
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(ck.directory, local_files_only=True)
    except Exception as e:  # transformers' own error for an unreadable tokenizer
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(field, ck.directory, f"its tokenizer cannot be loaded: "
                          f"{first[:200]}") from None


def load_codec(ck: ModelCheckpoint) -> HfCodec:
    """The text codec of ``ck``'s tokenizer, checked against its vocabulary."""
    tok = load_tokenizer(ck)
    return HfCodec(tok, special_tokens(ck, tok), len(tok))
