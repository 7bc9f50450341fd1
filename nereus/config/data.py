"""The ``data:`` and ``reward:`` sections of a config: the prompts a job trains on, the tokenizer
that reads them and the rule that scores the responses (checked here; pure).

``data:`` keys (all optional; without the section ``nereus run`` trains the built-in pattern
task, :data:`BUILTIN_DATA`): ``train`` (a jsonl or parquet file of prompts, one row each),
``val`` (a file of the same form, the validation set; ``runtime.val_every`` runs it),
``prompt_key`` (the column of the prompt, default ``prompt``: a string, or a list of chat
messages ``{role, content}``), ``answer_key`` (the column of the reference answer handed to the
reward, default ``answer``; ``null``: none), ``max_prompt_len`` (tokens; longer prompts are
dropped and counted; default and at most ``job.prompt_len``), ``seed`` (the sample order's seed;
default ``runtime.seed``), ``tokenizer`` (a Hugging Face tokenizer folder, ``tokenizer.json`` at
least; default the actor's checkpoint folder, ``models.actor.checkpoint``, when it has one),
``chat_template`` (true: each prompt goes through the tokenizer's chat template as a user
message, with the generation prompt).

``reward:`` keys: ``fn`` (``gsm8k``, ``math``, ``exact`` — the built-in scorers,
:mod:`nereus.rl.rewards.builtin` — or ``FILE.py:function``, a function ``f(prompt: str,
response: str, answer, row: dict) -> float`` of the user's), ``on_error`` (``fail``, default: an
exception or a non-finite or non-numeric value ends the run in one line naming the row and the
function; ``zero``: such a response scores 0, counted in the log), ``pass_threshold`` (a response
whose reward reaches it passes, for validation's pass@1; default 1.0, what a correct answer
scores with the built-in scorers).

Relative paths are read from the config file's folder; ``nereus:NAME`` names a file shipped in
the package's ``data/`` folder (the pattern task's). Files are read by the runtime
(:mod:`nereus.runtime.worker.inputs`), not here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nereus.config import fields as f
from nereus.errors import ConfigError

DATA_KEYS = ("train", "val", "prompt_key", "answer_key", "max_prompt_len", "seed", "tokenizer",
             "chat_template")
REWARD_KEYS = ("fn", "on_error", "pass_threshold")
BUILTIN_REWARDS = ("gsm8k", "math", "exact")
ON_ERROR = ("fail", "zero")
PACKAGE_PREFIX = "nereus:"  # a file shipped in the package's data/ folder
DATA_SUFFIXES = (".jsonl", ".parquet")


@dataclass(frozen=True)
class DataOptions:
    train: str
    tokenizer: str  # "": the actor's checkpoint folder (models.actor.checkpoint)
    val: str = ""
    prompt_key: str = "prompt"
    answer_key: str | None = "answer"
    max_prompt_len: int = 0  # 0: job.prompt_len
    seed: int = 0
    chat_template: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in DATA_KEYS}


@dataclass(frozen=True)
class RewardOptions:
    fn: str
    on_error: str = "fail"
    pass_threshold: float = 1.0

    @property
    def builtin(self) -> bool:
        return self.fn in BUILTIN_REWARDS

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in REWARD_KEYS}


# The built-in pattern task: data like any user's, shipped in the package (nereus/data/pattern).
BUILTIN_DATA = {"train": "nereus:pattern/train.jsonl", "tokenizer": "nereus:pattern",
                "prompt_key": "prompt", "answer_key": "answer"}
BUILTIN_REWARD = {"fn": "nereus:pattern/reward.py:pattern_reward"}


def _file(path: str, value: Any, suffixes: tuple[str, ...] = DATA_SUFFIXES) -> str:
    text = f.path(path, value)
    if not text:
        raise ConfigError(path, value, "must be a file path (not empty)")
    if not text.endswith(suffixes):
        raise ConfigError(path, value, f"must be a {' or '.join(s[1:] for s in suffixes)} "
                          "file (by its name)")
    return text


def _key(path: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > 256:
        raise ConfigError(path, value, "must be a column name (1..256 characters)")
    return value


def parse_data(raw: Mapping[str, Any] | None, prompt_len: int, seed: int,
               actor_checkpoint: bool = False) -> DataOptions:
    """The ``data:`` section (``None``: the built-in pattern task, read with the actor
    checkpoint's tokenizer when ``actor_checkpoint``); ``prompt_len`` is ``job.prompt_len``,
    ``seed`` ``runtime.seed`` (the sample order's default seed)."""
    given = raw is not None
    if raw is None:
        raw = ({k: v for k, v in BUILTIN_DATA.items() if k != "tokenizer"} if actor_checkpoint
               else BUILTIN_DATA)
    raw = f.mapping("data", raw, DATA_KEYS)
    if "train" not in raw:
        raise ConfigError("data.train", None, "missing: the jsonl or parquet file of prompts")
    train = _file("data.train", raw["train"])
    val = _file("data.val", raw["val"]) if raw.get("val") not in (None, "") else ""
    tokenizer = f.path("data.tokenizer", raw.get("tokenizer", ""))
    answer = raw.get("answer_key", "answer")
    max_len = raw.get("max_prompt_len", prompt_len)
    max_len = f.positive_int("data.max_prompt_len", max_len, "MAX_TOKENS")
    if max_len > prompt_len:
        raise ConfigError("data.max_prompt_len", max_len,
                          f"must be at most job.prompt_len={prompt_len} (the longest prompt the "
                          "plans hold)")
    if given and not tokenizer and not actor_checkpoint:
        raise ConfigError("data.tokenizer", None, "missing: a Hugging Face tokenizer folder "
                          "(tokenizer.json at least), or models.actor.checkpoint's")
    return DataOptions(
        train=train, tokenizer=tokenizer, val=val,
        prompt_key=_key("data.prompt_key", raw.get("prompt_key", "prompt")),
        answer_key=None if answer is None else _key("data.answer_key", answer),
        max_prompt_len=max_len,
        seed=f.non_negative_int("data.seed", raw.get("seed", seed), "MAX_SEED"),
        chat_template=f.boolean("data.chat_template", raw.get("chat_template", False)),
    )


def parse_reward(raw: Mapping[str, Any] | None, data_given: bool) -> RewardOptions:
    """The ``reward:`` section; without it, the pattern task's scorer when ``data:`` is absent
    too (a user's data needs a rule of the user's)."""
    if raw is None and data_given:
        raise ConfigError("reward.fn", None, "missing: gsm8k, math, exact or FILE.py:function "
                          "scores the responses to the prompts of data.train")
    raw = f.mapping("reward", BUILTIN_REWARD if raw is None else raw, REWARD_KEYS)
    if "fn" not in raw:
        raise ConfigError("reward.fn", None, "missing: gsm8k, math, exact or FILE.py:function")
    fn = raw["fn"]
    if not isinstance(fn, str) or "\0" in fn:
        raise ConfigError("reward.fn", fn, "must be gsm8k, math, exact or FILE.py:function")
    if fn not in BUILTIN_REWARDS:
        file, sep, name = fn.rpartition(":")
        if not sep or not file.endswith(".py") or not name.isidentifier():
            raise ConfigError("reward.fn", fn, "must be gsm8k, math, exact or FILE.py:function "
                              "(a Python file and the name of a function in it)")
    threshold = raw.get("pass_threshold", 1.0)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
            or abs(threshold) > 1e12 or not math.isfinite(threshold):
        raise ConfigError("reward.pass_threshold", threshold, "must be a finite number")
    return RewardOptions(fn=fn, on_error=f.choice("reward.on_error",
                                                  raw.get("on_error", "fail"), ON_ERROR),
                         pass_threshold=float(threshold))


def split_fn(fn: str) -> tuple[str, str]:
    """``"dir/r.py:score"`` → ``("dir/r.py", "score")``."""
    file, _, name = fn.rpartition(":")
    return file, name
