"""A run's inputs: the tokenizer, the prompt files and the reward, read and checked once per
process (``nereus run`` before it starts the ranks, every rank at start-up), and the setup the
runtime plans with — its prompt length the longest prompt the data holds (``job.prompt_len`` is
the bound: ``data.max_prompt_len`` defaults to it and longer prompts are dropped).

Every problem is one ``ConfigError`` naming the field, the value and the rule; nothing is
written. See :mod:`nereus.config.data` for the sections and :mod:`nereus.rl.data.dataset`,
:mod:`nereus.rl.data.tokenizer`, :mod:`nereus.rl.rewards` for what is read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from nereus.config.data import DataOptions, RewardOptions, parse_data, parse_reward
from nereus.errors import ConfigError
from nereus.rl.data.dataset import PromptSet, read_rows, tokenize
from nereus.rl.data.identity import data_identity
from nereus.rl.data.paths import resolve
from nereus.rl.data.tokenizer import TextCodec, check_vocab, load_tokenizer, tokenizer_folder
from nereus.rl.rewards.scoring import ScoreItem, Scorer, probe
from nereus.rl.sample_order import SampleOrder
from nereus.spec.job import Setup


@dataclass(frozen=True)
class RunInputs:
    options: DataOptions
    reward: RewardOptions
    codec: TextCodec
    train: PromptSet
    val: PromptSet | None
    scorer: Scorer
    order: SampleOrder  # over the kept rows of train
    identity: str  # data_identity(): what a resumed run must find unchanged

    def item(self, prompts: PromptSet, index: int, response: str, where: str = "") -> ScoreItem:
        """The reward function's arguments for kept row ``index`` of ``prompts``."""
        row = prompts.rows[index]
        answer = None if self.options.answer_key is None else row[self.options.answer_key]
        label = f"{prompts.field} row {int(prompts.source[index])}" + (f" ({where})" if where
                                                                       else "")
        return ScoreItem(self.codec.prompt_text(row[self.options.prompt_key]), response, answer,
                         row, label)

    def fingerprint(self) -> dict[str, Any]:
        """The ``data`` part of the job fingerprint (:mod:`nereus.config.fingerprint`)."""
        return {"source": self.options.train, "identity": self.identity}

    def summary(self) -> dict[str, Any]:
        """The run log's ``data`` event: files, rows kept and dropped, prompt lengths."""
        return {"identity": self.identity, "tokenizer": self.codec.folder,
                "eos_ids": list(self.codec.eos_ids), "pad_id": self.codec.pad_id,
                "chat_template": self.options.chat_template, "reward": self.reward.fn,
                "on_error": self.reward.on_error, "seed": self.options.seed,
                "max_prompt_len": self.options.max_prompt_len,
                "sets": [p.summary() for p in (self.train, self.val) if p is not None]}


def _check_models(codec: TextCodec, setup: Setup, checkpoints: Mapping[str, Any]) -> None:
    """Every model embeds the ids of the run's tokenizer (the token ids reach every model as
    they are: a critic or reward checkpoint must share the actor tokenizer's ids)."""
    for role, spec in setup.job.models:
        ck = checkpoints.get(role)
        field = f"models.{role}" + (".checkpoint" if ck is not None else ".vocab_size")
        check_vocab(codec, spec.vocab_size, field, ck.directory if ck is not None
                    else spec.vocab_size)


def load_inputs(cfg: Any, config_path: str, rc: Any, setup: Setup) -> tuple[RunInputs, Setup]:
    """The inputs of the run configured by ``cfg`` (read from ``config_path``; ``rc`` its
    ``RunConfig``) and the setup the runtime plans with. The tokenizer: ``data.tokenizer``,
    else the actor's checkpoint folder. The prompt files and the reward function are checked
    before the tokenizer is loaded (transformers takes seconds to import): a bad file is
    refused at once."""
    data_raw, reward_raw = cfg.section("data"), cfg.section("reward")
    checkpoints = dict(cfg.checkpoints)  # role → its Hugging Face checkpoint
    actor = checkpoints.get("actor")
    options = parse_data(data_raw, setup.job.prompt_len, rc.seed, actor is not None)
    reward = parse_reward(reward_raw, data_raw is not None)
    base = os.path.dirname(os.path.abspath(config_path))
    train_rows = read_rows(resolve(options.train, base), "data.train", options)
    val_rows = (read_rows(resolve(options.val, base), "data.val", options) if options.val
                else None)
    if rc.outputs.val_every and val_rows is None:
        raise ConfigError("runtime.val_every", rc.outputs.val_every,
                          "needs data.val, the validation prompts")
    from nereus.rl.rewards.loader import load_reward

    scorer = Scorer(load_reward(reward, base), reward)
    first = train_rows.rows[0]
    answer = None if options.answer_key is None else first[options.answer_key]
    where = "data.train row 0 (the probe before the run)"
    if isinstance(train_rows.prompts[0], str):  # else after the chat template is loaded
        probe(scorer, ScoreItem(train_rows.prompts[0], "", answer, first, where))
    folder, field = tokenizer_folder(resolve(options.tokenizer, base) if options.tokenizer
                                     else "", "" if actor is None else actor.directory)
    codec = load_tokenizer(folder, field, options.chat_template)
    _check_models(codec, setup, checkpoints)
    train = tokenize(train_rows, options, codec)
    val = None if val_rows is None else tokenize(val_rows, options, codec)
    if not isinstance(train_rows.prompts[0], str):
        probe(scorer, ScoreItem(codec.prompt_text(train_rows.prompts[0]), "", answer, first,
                                where))
    order = SampleOrder(train.size, options.seed)
    # data.seed left out where it is runtime.seed (the fingerprint's seed part has it)
    identity = data_identity(train.sha256, "" if val is None else val.sha256, codec.identity(),
                             {**options.to_dict(),
                              "seed": None if options.seed == rc.seed else options.seed})
    inputs = RunInputs(options, reward, codec, train, val, scorer, order, identity)
    measured = max(train.longest, 0 if val is None else val.longest)
    return inputs, replace(setup, job=replace(setup.job, prompt_len=measured))
