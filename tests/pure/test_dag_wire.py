"""The DAG's plain-data wire form (what rank 0 sends the ranks) decodes to the same frozen DAG."""

from __future__ import annotations

from hypothesis import assume, given, settings
from support.dag_cases import collections, compile_case

from nereus.emu.unit import Emu
from nereus.errors import InfeasiblePlanError, TransitionError
from nereus.transition.wire import dag_from_wire, dag_to_wire


@settings(max_examples=30, deadline=None)
@given(collections())
def test_dag_wire_roundtrip(case: tuple[tuple[Emu, ...], tuple[Emu, ...]]) -> None:
    try:
        dag = compile_case(*case)
    except (TransitionError, InfeasiblePlanError):
        assume(False)
        return
    again = dag_from_wire(dag_to_wire(dag))
    assert again == dag
    assert again.primitives == dag.primitives and again.order == dag.order
