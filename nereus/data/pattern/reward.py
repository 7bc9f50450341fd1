"""The pattern task's reward, a reward function like any user's (``reward.fn:
nereus:pattern/reward.py:pattern_reward``).

A prompt is ``"<pattern>:"`` for a short pattern of the letters a-e, its answer the pattern; the
correct response repeats the pattern cyclically. Partial credit over the first ``CREDIT_LEN``
characters of the response (its text up to its EOS, special tokens skipped): the correct run
from the start (exact continuation) plus every position that matches the cyclic pattern, times
``CREDIT`` = 0.5 — a character of the correct run earns 1.0, a matching one after a mistake 0.5.
Credit of order one per token keeps the score above the noise of an untrained critic, so PPO
learns within a few steps; as the policy learns it stops later, and rewarded responses grow
longer: the length drift the controller reacts to arises by itself.
"""

from __future__ import annotations

from typing import Any

CREDIT_LEN = 64
CREDIT = 0.5


def pattern_reward(prompt: str, response: str, answer: Any, row: Any = None) -> float:
    want = str(answer) if answer else prompt.removesuffix(":")
    run, matches, running = 0, 0, True
    for i, ch in enumerate(response[:CREDIT_LEN]):
        hit = ch == want[i % len(want)]
        matches += hit
        running = running and hit
        run += running
    return CREDIT * (run + matches)
