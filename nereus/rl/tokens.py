"""Text ↔ token ids for the RL step: one seam for every tokenizer (the task's own, a
checkpoint's Hugging Face tokenizer).

The step encodes prompt texts with a :class:`TextCodec`, left-pads them with its ``pad_id`` (the
padding masked out of attention: :mod:`nereus.engines.masks`), generates until any of its
``eos_ids`` and scores responses through it. Two codecs exist:

- :class:`TaskCodec`: the pattern task's character-level vocabulary (:mod:`nereus.rl.task`:
  PAD 0, EOS 1), whose rewards are counted on token ids;
- :class:`nereus.hf.tokenizer.HfCodec`: a checkpoint's tokenizer loaded through transformers,
  its EOS ids from ``generation_config.json`` and the tokenizer, its PAD from the tokenizer;
  rewards are computed on the decoded text.

A new source of prompts (datasets, chat templates) plugs in as another codec or around one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from nereus.rl.task import EOS, PAD, VOCAB_SIZE, decode, encode


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


@runtime_checkable
class TextCodec(Protocol):
    """What the RL step needs of a tokenizer."""

    special: SpecialTokens
    vocab_size: int  # ids are below it
    ids_reward: bool  # True: the task scores token ids; False: decoded text

    def encode(self, text: str) -> list[int]:
        """The token ids of a prompt (special tokens the tokenizer adds by default included)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (special tokens left out)."""
        ...


class TaskCodec:
    """The pattern task's character-level vocabulary (:mod:`nereus.rl.task`)."""

    special = SpecialTokens(eos_ids=(EOS,), pad_id=PAD)
    vocab_size = VOCAB_SIZE
    ids_reward = True

    def encode(self, text: str) -> list[int]:
        return encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return decode([int(i) for i in ids])


def response_ids(ids: Sequence[int], special: SpecialTokens) -> list[int]:
    """A response's ids up to its first EOS (excluded)."""
    out = []
    for t in ids:
        if int(t) in special.eos_ids:
            break
        out.append(int(t))
    return out
