"""The embedded verifiable task: continue a pattern, rewarded per correct character.

A prompt is ``"<pattern>:"`` for a short pattern of lowercase letters; the correct response
repeats the pattern cyclically and ends with ``"\\n"``. The rule-based reward counts the correct
characters before the first mistake (or end of sequence), divided by ``target_len``, capped at 1.
A random policy stops early and errs; as it learns, rewarded responses get longer, so the
generated length drifts upward by itself — the drift the controller reacts to.

Character-level tokenizer: token id = ``ord(c)`` (ASCII < 128); ``EOS = ord("\\n")``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EOS = ord("\n")
PAD = 0
ALPHABET = "abcdefgh"


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(tokens: list[int]) -> str:
    return "".join(chr(t) for t in tokens if 0 < t < 128)


@dataclass(frozen=True)
class PatternTask:
    dataset_size: int = 4096
    min_pattern: int = 2
    max_pattern: int = 4
    target_len: int = 48
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

    def reward(self, prompt: str, response_tokens: list[int]) -> float:
        pattern = self.pattern_of(prompt)
        correct = 0
        for i, tok in enumerate(response_tokens):
            if tok == EOS:
                break
            if tok != ord(pattern[i % len(pattern)]):
                break
            correct += 1
        return min(correct, self.target_len) / self.target_len
