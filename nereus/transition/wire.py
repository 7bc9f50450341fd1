"""A transition DAG (or a host-staged transition) as plain data for the MPI control plane, and
back (effectful shell).

Rank 0 compiles the DAG (pure core) and broadcasts it in a ``dag`` message; every rank decodes
the same frozen :class:`~nereus.transition.dag.TransitionDag` and drives it. The encoding walks
the dataclass fields generically, so a field added to a primitive travels without a change here:
an EMU is ``{"E": [model_stage, state, tp, pp, gpus]}``, a frozenset ``{"S": [...]}``, a
primitive ``{"P": kind, "f": {field: value}}``, every other sequence a list (tuples on decode).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from nereus.emu.primitives import Destroy, Extend, Merge, Split
from nereus.emu.unit import Emu, Layout
from nereus.errors import CommunicationError
from nereus.transition.dag import TransitionDag

if TYPE_CHECKING:
    from nereus.transition.staged import StagedTransition

_KINDS: dict[str, type] = {"split": Split, "merge": Merge, "extend": Extend, "destroy": Destroy}
_NAMES = {v: k for k, v in _KINDS.items()}


def _enc(v: Any) -> Any:
    if isinstance(v, Emu):
        return {"E": [v.model_stage, v.state, v.layout.tp, v.layout.pp, list(v.gpus)]}
    if type(v) in _NAMES:
        return {"P": _NAMES[type(v)],
                "f": {f.name: _enc(getattr(v, f.name)) for f in dataclasses.fields(v)}}
    if isinstance(v, frozenset):
        return {"S": sorted((_enc(x) for x in v), key=repr)}
    if isinstance(v, (tuple, list)):
        return [_enc(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise CommunicationError(f"dag wire: cannot encode {type(v).__name__}")


def _dec(v: Any) -> Any:
    if isinstance(v, dict):
        if "E" in v:
            ms, state, tp, pp, gpus = v["E"]
            return Emu(str(ms), str(state), Layout(int(tp), int(pp)), tuple(int(g) for g in gpus))
        if "P" in v:
            kind = _KINDS.get(v["P"])
            if kind is None:
                raise CommunicationError(f"dag wire: unknown primitive kind {v['P']!r}")
            return kind(**{k: _dec(x) for k, x in v["f"].items()})
        if "S" in v:
            return frozenset(_dec(x) for x in v["S"])
        raise CommunicationError(f"dag wire: unknown record {sorted(v)}")
    if isinstance(v, list):
        return tuple(_dec(x) for x in v)
    return v


def dag_to_wire(dag: TransitionDag) -> dict[str, Any]:
    return {f.name: _enc(getattr(dag, f.name)) for f in dataclasses.fields(dag)}


def dag_from_wire(d: Any) -> TransitionDag:
    if not isinstance(d, dict):
        raise CommunicationError(f"dag wire: not a DAG record: {type(d).__name__}")
    return TransitionDag(**{k: _dec(v) for k, v in d.items()})


def staged_to_wire(st: StagedTransition) -> dict[str, Any]:
    """A host-staged transition as plain data: its host stages, the rest's DAG and costs."""
    return {"stages": [{f.name: _enc(getattr(h, f.name)) for f in dataclasses.fields(h)}
                       for h in st.stages],
            "dag": dag_to_wire(st.rest.dag), "rest_s": st.rest.cost_s,
            "offload_s": st.offload_s, "reload_s": st.reload_s,
            "host_bytes": [list(x) for x in st.host_bytes], "reason": st.reason}


def staged_from_wire(d: Any) -> StagedTransition:
    from nereus.transition.planned import PlannedTransition
    from nereus.transition.staged import HostStage, StagedTransition

    if not isinstance(d, dict) or not isinstance(d.get("stages"), list):
        raise CommunicationError("staged wire: not a staged-transition record")
    stages = tuple(HostStage(**{k: _dec(v) for k, v in h.items()}) for h in d["stages"])
    rest = PlannedTransition(float(d["rest_s"]), reference=dag_from_wire(d["dag"]))
    return StagedTransition(stages, rest, float(d["offload_s"]), float(d["reload_s"]),
                            tuple((int(g), int(b)) for g, b in d["host_bytes"]),
                            str(d["reason"]))
