"""The tokenizer a job's prompts and responses go through: a Hugging Face tokenizer folder read
with transformers (``AutoTokenizer``; a folder holding only ``tokenizer.json``, or a tokenizer
folder without a model's ``config.json`` whose ``tokenizer_config.json`` names the generic fast
class, is read as a ``PreTrainedTokenizerFast`` directly: the class AutoTokenizer resolves it
to, without the auto classes' torch import), its chat template, EOS and PAD.

EOS, PAD and BOS ids: by the one rule of :func:`nereus.rl.tokens.special_tokens_of`, from the
tokenizer and the folder's ``generation_config.json`` and ``config.json`` (a checkpoint folder
has both). A prompt is a string (encoded with the tokenizer's own special
tokens, e.g. a BOS) or, with ``data.chat_template: true``, goes through the chat template as
``[{"role": "user", "content": prompt}]`` (a list of messages as it is) with the generation
prompt — the ids ``AutoTokenizer.apply_chat_template(..., add_generation_prompt=True)`` gives. A
response is decoded from its ids up to its first EOS, special tokens skipped (what
verl and OpenRLHF hand their reward functions).

Where the tokenizer comes from: ``data.tokenizer``, else the actor's checkpoint folder
(``models.actor.checkpoint``; :func:`tokenizer_folder`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

from nereus.errors import ConfigError
from nereus.rl.tokens import SpecialTokens, response_ids, special_tokens_of

# the files of a tokenizer and its generation settings (hashed into the run's data identity;
# copied beside the weights of a Hugging Face export)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "generation_config.json")


# tokenizer_config.json's class names of the generic fast tokenizer (transformers 4.x; 5.x)
GENERIC_FAST = ("PreTrainedTokenizerFast", "TokenizersBackend")


def tokenizer_folder(data_tokenizer: str, checkpoint: str = "") -> tuple[str, str]:
    """(folder, the field that names it): ``data.tokenizer`` when given, else the actor's
    checkpoint folder (``models.actor.checkpoint``, when the config has one)."""
    if data_tokenizer:
        return data_tokenizer, "data.tokenizer"
    if checkpoint:
        return checkpoint, "models.actor.checkpoint"
    raise ConfigError("data.tokenizer", None, "missing: a Hugging Face tokenizer folder "
                      "(tokenizer.json at least)")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


class TextCodec:
    """Prompts to token ids and response ids to text, through one Hugging Face tokenizer."""

    ids_reward = False  # rewards are computed on the decoded text

    def __init__(self, tokenizer: Any, folder: str, field: str, chat_template: bool) -> None:
        self.tokenizer = tokenizer
        self.folder = folder
        self.field = field
        self.chat_template = chat_template
        from nereus.config.checkpoint_files import folder_json

        special = special_tokens_of(tokenizer.eos_token_id, tokenizer.pad_token_id,
                                    tokenizer.bos_token_id,
                                    folder_json(field, folder, "generation_config.json"),
                                    folder_json(field, folder, "config.json"))
        if special is None:
            raise ConfigError(field, folder, "names no EOS id (generation_config.json, the "
                              "tokenizer and config.json have none)")
        self.special: SpecialTokens = special
        self.vocab_size: int = len(tokenizer)
        if chat_template and not getattr(tokenizer, "chat_template", None):
            raise ConfigError("data.chat_template", True, f"the tokenizer in {folder} has no "
                              "chat template")

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self.special.eos_ids

    @property
    def pad_id(self) -> int:
        return self.special.pad_id

    def identity(self) -> str:
        """sha256 over the tokenizer's files (their names and bytes) and the template switch."""
        h = hashlib.sha256(f"chat_template={self.chat_template}".encode())
        for name in TOKENIZER_FILES:
            path = os.path.join(self.folder, name)
            if os.path.isfile(path):
                h.update(name.encode())
                with open(path, "rb") as fh:
                    h.update(hashlib.sha256(fh.read()).digest())
        return h.hexdigest()

    def messages(self, prompt: Any) -> list[dict[str, str]]:
        """The chat of a prompt: a string as one user message, a list of messages as it is."""
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        return list(prompt)

    def encode(self, prompt: Any) -> list[int]:
        """The token ids of one prompt (see :meth:`encode_all`)."""
        return self.encode_all([prompt])[0]

    def encode_all(self, prompts: Sequence[Any]) -> list[list[int]]:
        """Token ids of each prompt (chat-templated with ``data.chat_template``)."""
        tok = self.tokenizer
        if self.chat_template:
            return [list(tok.apply_chat_template(self.messages(p), add_generation_prompt=True,
                                                 tokenize=True, return_dict=False))
                    for p in prompts]
        return [list(ids) for ids in tok(list(prompts))["input_ids"]] if prompts else []

    def prompt_text(self, prompt: Any) -> str:
        """What a reward function gets as ``prompt``: the prompt string, or a list of messages
        rendered by the chat template."""
        if isinstance(prompt, str):
            return prompt
        return str(self.tokenizer.apply_chat_template(self.messages(prompt), tokenize=False,
                                                      add_generation_prompt=True))

    def response_ids(self, ids: Sequence[int]) -> list[int]:
        """``ids`` up to the first EOS (excluded: :func:`nereus.rl.tokens.response_ids`)."""
        return response_ids(ids, self.special)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of a response's ids, special tokens (EOS, PAD) skipped."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))


def check_vocab(codec: TextCodec, vocab_size: int, field: str, value: object) -> None:
    """A model with ``vocab_size`` embeddings (``field``/``value`` name it) embeds every id of
    ``codec``: its tokens and its special ids."""
    if codec.vocab_size > vocab_size:
        raise ConfigError(field, value, f"the tokenizer in {codec.folder} has "
                          f"{codec.vocab_size} tokens; vocab_size={vocab_size} cannot embed "
                          "them")
    for name, i in (("EOS", max(codec.eos_ids)), ("PAD", codec.pad_id)):
        if i >= vocab_size:
            raise ConfigError(field, value, f"vocab_size={vocab_size} cannot embed {name} id "
                              f"{i} of the tokenizer in {codec.folder}")


def _generic_fast(folder: str, field: str) -> bool:
    """True when ``tokenizer_config.json`` names the generic fast tokenizer class and no
    ``config.json`` lies beside it: the class ``AutoTokenizer`` then instantiates (with a
    model's config.json, transformers 5.x picks the model type's class instead). Read with the
    checkpoint files' bounded reader: a malformed file is one line naming it."""
    from nereus.config.checkpoint_files import folder_json

    if os.path.exists(os.path.join(folder, "config.json")):
        return False
    config = folder_json(field, folder, "tokenizer_config.json")
    return config is not None and config.get("tokenizer_class") in GENERIC_FAST


def load_tokenizer(folder: str, field: str, chat_template: bool) -> TextCodec:
    """The tokenizer in ``folder`` (an absolute path; ``field`` names it in errors)."""
    if not os.path.isdir(folder):
        what = "no such folder" if not os.path.exists(folder) else "is not a folder"
        raise ConfigError(field, folder, f"{what} (a Hugging Face tokenizer folder, "
                          "tokenizer.json at least)")
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        raise ConfigError(field, folder, "has no tokenizer.json (a Hugging Face tokenizer "
                          "folder; slow, sentencepiece-only tokenizers are not read)")
    try:
        from transformers import PreTrainedTokenizerFast
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise ConfigError(field, folder, "needs transformers (pip install 'nereus[data]')"
                          ) from None
    hf_logging.set_verbosity_error()  # its warnings are not this run's one-line errors
    generic = _generic_fast(folder, field)
    try:
        if generic:
            # the class AutoTokenizer resolves such a folder to, without importing the auto
            # classes (they import torch: ~3 s of CPU in every process, ranks and launcher)
            tok = PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
        elif os.path.isfile(os.path.join(folder, "tokenizer_config.json")):
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(folder, local_files_only=True,
                                                trust_remote_code=False)
        else:
            tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"))
    except Exception as e:  # transformers' own errors are of many kinds
        raise ConfigError(field, folder, f"cannot be read by transformers: {_first_line(e)}"
                          ) from None
    return TextCodec(tok, folder, field, chat_template)
