"""Scoring responses: the built-in GSM8K, MATH and exact-match scorers, a user's function loaded
from a file, and the batch scorer that runs them on the ranks."""
