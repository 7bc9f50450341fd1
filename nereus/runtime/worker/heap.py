"""Python's cyclic garbage collector on a rank (effectful).

A rank holds some 400,000 long-lived Python objects once it has imported torch, Megatron-core,
NumPy and h5py. CPython's collector scans every one of them at each full (generation 2)
collection, and it starts one whenever enough new objects have survived since the last. On the
README job's 8 CPU ranks (2026-12-03) every rank ran seven full collections while starting
(0.1-1.0 s each) and an eighth inside the run's first transition, which builds the first new
models and groups of the run: 0.3-0.9 s on every rank at once, while its peers waited on it.
That pause took the first transition from 0.4-0.7 s to 1.6-2.2 s; no cost model predicts it.

:func:`settle`, called once the rank has imported and configured everything and before it
builds any unit, collects and then freezes every object alive into the collector's permanent
generation (:func:`gc.freeze`, as vLLM's engine does after start-up), so later collections scan
only what was created since: the units, their models and optimizers, a step's objects. Units
are built after the freeze, so a model that a transition replaces stays collectable; nothing
frozen is garbage (it was collected first) and what is frozen is still freed by reference
counting when its last reference goes.
"""

from __future__ import annotations

import gc
import time


def settle() -> tuple[int, float]:
    """Collect, then freeze what lives (module docstring). Returns the number of objects frozen
    and the seconds it took."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count(), time.perf_counter() - t0
