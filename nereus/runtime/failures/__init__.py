"""Surviving failures: ULFM shrink, safe boundaries kept on every rank, global checkpoints, relaunch on the surviving nodes (effectful)."""
