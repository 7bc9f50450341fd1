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

    def reward_text(self, prompt: str, response: str) -> float:
        """The same credit counted on characters of a decoded response (up to its first EOS):
        the reward of a model with another tokenizer (a Hugging Face checkpoint's)."""
        want = self.pattern_of(prompt)
        run, matches, running = 0, 0, True
        for i, ch in enumerate(response[: self.credit_len]):
            hit = bool(want) and ch == want[i % len(want)]
            matches += hit
            running = running and hit
            run += running
        return self.credit * (run + matches)


def task_identity(seed: int) -> dict[str, object]:
    """The identity of the prompts of the built-in task a run with ``seed`` trains on: the
    ``data`` part of the job fingerprint (:mod:`nereus.config.fingerprint`)."""
    from dataclasses import asdict

    return {"source": "built-in pattern task", **asdict(PatternTask(seed=seed)),
            "alphabet": ALPHABET, "vocab_size": VOCAB_SIZE}
