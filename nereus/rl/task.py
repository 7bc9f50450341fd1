"""The embedded verifiable task: continue a pattern, rewarded per correct character.

A prompt is ``"<pattern>:"`` for a short pattern of letters from ``ALPHABET``; the correct
response repeats the pattern cyclically. The rule-based reward gives partial credit: over the
first ``credit_len`` response tokens before the first EOS, it counts the correct run from the
start (exact continuation) plus every position that matches the cyclic pattern, times
``credit`` = 0.5: a token of the correct run earns 1.0, a matching token after a mistake 0.5.
(Credit of order one per token keeps the score above the noise of an untrained critic, so PPO
learns within a few steps.) A random policy over the tiny
vocabulary scores above 0 (a letter matches with probability 1/8) and stops early (EOS with
probability 1/8); every correct token adds credit, so as the policy learns it stops later and
rewarded responses get longer — the length drift the controller reacts to arises by itself.

Character-level tokenizer with a tiny vocabulary of ``VOCAB_SIZE`` = 8 ids: ``PAD`` 0, ``EOS``
1 (``"\\n"``), ``SEP`` 2 (``":"``), then the letters. Models of the task need ``vocab_size``
≥ ``VOCAB_SIZE`` (ids above it are never correct; the example config uses exactly 8).

The runtime trains the task as data like any user's: this module writes the files shipped in
``nereus/data/pattern`` (``python -m nereus.rl.task DIR``): ``train.jsonl`` (the prompts of
indices 0..4095 with their patterns as answers), ``val.jsonl`` (64 prompts of another seed) and
the tokenizer (``tokenizer.json`` and ``tokenizer_config.json``, built with ``tokenizers``: the
same ids, PAD ``<pad>`` and EOS ``</s>`` as special tokens); the reward is the function in
``nereus/data/pattern/reward.py`` (:data:`REWARD_FN`), scoring the decoded response.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAD = 0
EOS = 1
SEP = 2
ALPHABET = "abcde"
SPECIAL = {"\n": EOS, ":": SEP}
VOCAB_SIZE = 3 + len(ALPHABET)
_ID = {**SPECIAL, **{c: 3 + i for i, c in enumerate(ALPHABET)}}
_CHAR = {v: k for k, v in _ID.items()}
PAD_TOKEN, EOS_TOKEN = "<pad>", "</s>"
TRAIN_ROWS, VAL_ROWS, VAL_SEED = 4096, 64, 1
REWARD_FN = "nereus:pattern/reward.py:pattern_reward"


def encode(text: str) -> list[int]:
    try:
        return [_ID[c] for c in text]
    except KeyError as e:
        raise ValueError(f"character {e.args[0]!r} is not in the task's vocabulary") from None


def decode(tokens: list[int]) -> str:
    """Text of ``tokens``; PAD and ids outside the vocabulary are dropped."""
    return "".join(_CHAR[t] for t in tokens if t in _CHAR)


@dataclass(frozen=True)
class PatternTask:
    dataset_size: int = 4096
    min_pattern: int = 2
    max_pattern: int = 4
    credit_len: int = 64
    credit: float = 0.5
    seed: int = 0

    def prompt(self, index: int) -> str:
        rng = np.random.Generator(np.random.PCG64([self.seed, index]))
        n = int(rng.integers(self.min_pattern, self.max_pattern + 1))
        letters = rng.integers(0, len(ALPHABET), size=n)
        return "".join(ALPHABET[int(i)] for i in letters) + ":"

    def prompt_tokens(self, index: int) -> list[int]:
        return encode(self.prompt(index))

    @staticmethod
    def pattern_of(prompt: str) -> str:
        return prompt[:-1] if prompt.endswith(":") else prompt

    def counts(self, prompt: str, response_tokens: list[int]) -> tuple[int, int]:
        """(correct run from the start, matching positions) within the first ``credit_len``
        tokens before EOS."""
        want = encode(self.pattern_of(prompt))
        run, matches, running = 0, 0, True
        for i, tok in enumerate(response_tokens[: self.credit_len]):
            if tok == EOS:
                break
            hit = tok == want[i % len(want)]
            matches += hit
            running = running and hit
            run += running
        return run, matches

    def reward(self, prompt: str, response_tokens: list[int]) -> float:
        run, matches = self.counts(prompt, response_tokens)
        return self.credit * (run + matches)


def build_tokenizer() -> object:
    """The task's tokenizer as a transformers ``PreTrainedTokenizerFast`` (ids as ``_ID``)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD_TOKEN: PAD, EOS_TOKEN: EOS, ":": SEP,
             **{c: 3 + i for i, c in enumerate(ALPHABET)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([PAD_TOKEN, EOS_TOKEN])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN,
                                   pad_token=PAD_TOKEN, model_max_length=4096)


def rows(task: PatternTask, count: int) -> list[dict[str, str]]:
    return [{"prompt": task.prompt(i), "answer": task.pattern_of(task.prompt(i))}
            for i in range(count)]


def write_files(folder: str) -> None:
    """The shipped files of the task into the existing folder ``folder``."""
    import json
    import os

    for name, task, count in (("train.jsonl", PatternTask(seed=0), TRAIN_ROWS),
                              ("val.jsonl", PatternTask(seed=VAL_SEED), VAL_ROWS)):
        with open(os.path.join(folder, name), "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows(task, count))
    build_tokenizer().backend_tokenizer.save(  # type: ignore[attr-defined]
        os.path.join(folder, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS_TOKEN,
              "pad_token": PAD_TOKEN, "model_max_length": 4096}  # transformers 4.x and 5.x
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=2, sort_keys=True)
        fh.write("\n")


if __name__ == "__main__":
    import sys

    write_files(sys.argv[1])
