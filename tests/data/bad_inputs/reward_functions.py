"""Reward functions for the bad-input corpus: one returns a string."""


def word(prompt, response, answer, row):
    return "high"
