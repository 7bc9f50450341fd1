"""Trace loaders: the shared real traces load; malformed traces give one ConfigError line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nereus.errors import ConfigError
from nereus.sim.traces import (
    REBASE_LEAD_S,
    load_fault_trace,
    load_length_trace,
    load_spot_trace,
    paper_length_trace,
    write_length_trace,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"
SPOT = DATA / "spot-traces" / "availability-16node"
needs_data = pytest.mark.skipif(not SPOT.is_dir(), reason="data/traces missing")


@needs_data
@pytest.mark.parametrize("name", ["us-east-2b_v100_1.json", "us-west-2a_v100_1.json"])
def test_shared_spot_traces_have_many_changes(name: str) -> None:
    raw = json.loads((SPOT / name).read_text())
    tr = load_spot_trace(SPOT / name, gpus_per_node=2, max_gpus=32)
    assert len(tr.gpus) == len(raw["data"])
    assert max(tr.gpus) == 32 and min(tr.gpus) == 0
    assert tr.gpus[5] == min(32, raw["data"][5] * 2)
    # DESIGN.md §1: more than 10 availability changes of a 16-GPU job in 10 h (120 ticks).
    assert load_spot_trace(SPOT / name, 1).changes > 10
    assert tr.at(tr.times_s[7] + 1.0) == tr.gpus[7]


@needs_data
def test_shared_fault_trace_takes_nodes_down_and_up() -> None:
    path = DATA / "fault-trace" / "fault_trace_first_half.json"
    tr = load_fault_trace(path, 16, 8)
    assert tr.gpus[0] == 128 and min(tr.gpus) < 128 and tr.changes > 5
    assert all(g % 8 == 0 for g in tr.gpus)
    # rebased: the first fault one minute into the run, not days into the trace
    assert tr.times_s[1] == pytest.approx(REBASE_LEAD_S) and tr.gpus[1] < 128
    raw = load_fault_trace(path, 16, 8, rebase=False)
    assert raw.gpus == tr.gpus and raw.times_s[1] > 86400.0
    offset = raw.times_s[1] - tr.times_s[1]
    assert all(a - b == pytest.approx(offset) for a, b in zip(raw.times_s[1:], tr.times_s[1:], strict=True))
    # the time scale compresses the gaps between events
    fast = load_fault_trace(path, 16, 8, time_scale=0.01)
    assert fast.gpus == tr.gpus
    assert fast.times_s[2] - fast.times_s[1] == pytest.approx(0.01 * (tr.times_s[2] - tr.times_s[1]))
    with pytest.raises(ConfigError, match="--trace-time-scale"):
        load_fault_trace(path, 16, 8, time_scale=0.0)


def test_length_trace_round_trip_and_interpolation(tmp_path: Path) -> None:
    p = tmp_path / "len.csv"
    p.write_text(write_length_trace(paper_length_trace("25-step"), 25))
    tr = load_length_trace(p)
    assert tr.at(0).mean == pytest.approx(1147.5, abs=0.05)
    assert tr.at(24).mean == pytest.approx(3722.0, abs=0.05)
    assert tr.at(100).p95 == pytest.approx(4072.0, abs=0.05)


@pytest.mark.parametrize(
    "text,field",
    [
        ("", "header"),
        ("step,mean\n0,1\n", "header"),
        ("step,mean,p95\n0,abc,2\n", "line 2"),
        ("step,mean,p95\n0,10,5\n", "line 2"),
        ("step,mean,p95\n3,10,12\n2,10,12\n", "line 3"),
        ("step,mean,p95\n", "no rows"),
        ("step,mean,p95\n0,1,2,3\n", "line 2"),
    ],
)
def test_bad_length_traces(tmp_path: Path, text: str, field: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_length_trace(p)
    assert field in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize(
    "content,needle",
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "metadata"),
        ('{"metadata": {"gap_seconds": 0}, "data": [1]}', "gap_seconds"),
        ('{"metadata": {"gap_seconds": 300}, "data": []}', "non-empty"),
        ('{"metadata": {"gap_seconds": 300}, "data": [1, -2]}', "data[1]"),
        ('{"metadata": {"gap_seconds": 300}, "data": [1, true]}', "data[1]"),
    ],
)
def test_bad_spot_traces(tmp_path: Path, content: str, needle: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(ConfigError) as exc:
        load_spot_trace(p, 2)
    assert needle in str(exc.value)


def test_bad_fault_trace_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "f.json"
    p.write_text('[{"node_id": "a", "event_time": 1.0, "event_type": "crash"}]')
    with pytest.raises(ConfigError, match="event_type"):
        load_fault_trace(p, 4, 8)
    with pytest.raises(ConfigError, match="no such file"):
        load_spot_trace(tmp_path / "missing.json", 2)
