"""The transition of a plan change: the global DAG of EMU primitives, planned once (pure).

The public entry is :func:`plan_transition` (the one function the controller calls) and the
:class:`PlannedTransition` it returns (the DAG and its L̂_tran). Inside:

- ``planned.py``: that entry, and the choice between the two compilers below;
- ``reference/``: the reference compiler on per-primitive records (local DAGs through T_sub,
  the global DAG with resource edges, memory batches);
- ``batched/``: the same DAG built on GPU arrays for large transitions;
- ``dag.py`` (the DAG record), ``graph.py`` (graph utilities both compilers share),
  ``residency.py`` (co-residency and the per-GPU memory bound), ``phases.py`` (worst-case bytes
  over every execution), ``cost.py`` (L̂_tran), ``validate.py``, ``schedule.py`` (one scheduler
  for simulated and real execution), ``wire.py`` (the DAG as plain data for the control plane),
  ``baselines.py`` (per-component migration), ``semantics.py`` (the rules every schedule of
  the primitives obeys), ``exact.py`` (the exact scheduler under those rules only),
  ``schedule_check.py`` (a timed schedule checked against those rules by interval arithmetic,
  sharing no code with the scheduler or ``semantics.py``),
  ``reachable.py`` (a proof that no transition exists).

The primitives themselves are :mod:`nereus.emu.primitives`.
"""

from nereus.transition.planned import PlannedTransition, plan_transition

__all__ = ["PlannedTransition", "plan_transition"]
