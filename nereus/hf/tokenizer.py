"""A checkpoint's tokenizer as the run's text codec (effectful: transformers).

:func:`load_codec` reads the tokenizer files of a checkpoint folder through
:func:`nereus.rl.data.tokenizer.load_tokenizer` (offline: only the folder is read; EOS, PAD and
BOS by the one rule of :func:`nereus.rl.tokens.special_tokens_of`, ``generation_config.json`` and
``config.json`` of the folder included) and checks it against the checkpoint's vocabulary
(:func:`nereus.rl.data.tokenizer.check_vocab`): a tokenizer with more tokens than
``config.json``'s ``vocab_size``, a special id outside it, a folder without tokenizer files and a
checkpoint with no EOS id at all are one-line :class:`~nereus.errors.ConfigError`\\ s.
"""

from __future__ import annotations

from nereus.config.checkpoint import ModelCheckpoint
from nereus.rl.data.tokenizer import TOKENIZER_FILES, TextCodec, check_vocab, load_tokenizer

__all__ = ["TOKENIZER_FILES", "load_codec"]


def load_codec(ck: ModelCheckpoint, chat_template: bool = False) -> TextCodec:
    """The text codec of ``ck``'s tokenizer, checked against its vocabulary."""
    field = f"models.{ck.role}.checkpoint"
    codec = load_tokenizer(ck.directory, field, chat_template)
    check_vocab(codec, ck.spec.vocab_size, field, ck.directory)
    return codec
