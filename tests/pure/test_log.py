"""HDF5 run log in this process: round trip, file layout, refusals, unflushed rows, damaged and
foreign files, the report; the writer processes are in ranks/test_log_writer_procs.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from support.log_files import PNG_MAGIC, plan_of, valid_log, write_full_log

from nereus.cli import main as cli_main
from nereus.errors import ConfigError, LogFormatError
from nereus.log import schema as S
from nereus.log.reader import read_run_log, swmr_fapl
from nereus.log.writer import RunLogWriter
from nereus.spec.plan import ExecutionPlan

REPO = Path(__file__).resolve().parents[2]


def test_round_trip_of_every_record_type(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    write_full_log(path)
    log = read_run_log(path)
    assert log.schema_version == S.SCHEMA_VERSION and log.closed
    assert log.run_meta == {"job": "rt", "n": 1}
    assert log.config == {"model": "tiny-gpt", "lr": 1e-5}
    assert ExecutionPlan.from_dict(log.initial_plan) == plan_of(2, 1)
    st = log.steps
    assert st["step"].tolist() == list(range(6))
    assert st["step_s"].tolist() == [2.0 + s for s in range(6)]
    assert st["gen_len_p95"].tolist() == [20.0 * s for s in range(6)]
    assert st["tokens"].tolist() == [7 * s for s in range(6)]
    assert np.isnan(st["reward"]).all() and (st["pool_gpus"] == 3).all()
    assert st["stage_s"][4] == {"actor-gen": 5.0}
    # the transition after step 2 puts plan 1 in force from step 3
    assert st["plan_version"].tolist() == [0, 0, 0, 1, 1, 1]
    mem = log.tables["gpu_memory"]
    assert mem["peak_bytes"].tolist() == [10 * s + g for s in range(6) for g in range(3)]
    assert mem["global_gpu"].tolist() == [0, 1, 2] * 6
    cal = log.tables["calibration_samples"]
    assert cal["hardware"].tolist() == ["h200"] * 6 and cal["op_class"][0] == "gemm"
    assert cal["measured_s"].tolist() == [0.7 * s for s in range(6)]
    assert log.tables["efficiencies"]["efficiency"][5] == pytest.approx(0.30)
    rp = log.tables["replans"]
    assert rp["trigger"].tolist() == ["gpu-pool-change"]
    assert ExecutionPlan.from_dict(rp["candidates"][0][0]) == plan_of(1, 2)
    assert rp["predicted_s"][0] == {"0": 1.5} and rp["predicted_memory_bytes"][0] == {"0": 3e9}
    ad = log.tables["admissions"]
    assert ad["admitted"].tolist() == [True, False] and ad["admitted"].dtype == np.bool_
    assert ad["path"].tolist() == ["urgent", "opportunistic"]
    assert ad["reason"].tolist() == [{"why": "lost GPU", "gpu": 3}, "ratio 0.7 > 0.5"]
    assert ad["horizon_steps"].tolist() == [1.0, 2.0]
    tr = log.tables["transitions"]
    assert tr["transfer_bytes"].tolist() == [123_456_789]
    assert tr["dag"][0] == {"nodes": [1, 2], "edges": [[1, 2]]}
    assert tr["primitives"][0] == ["split", "merge"]
    assert ExecutionPlan.from_dict(tr["plan"][0]) == plan_of(1, 2)
    ev = log.events
    assert ev["kind"].tolist() == ["run-start", "node-failure", "run-end"]
    assert ev["time_s"][1] == 1234.5 and ev["detail"][1] == {"node": "n3"}
    assert ev["detail"][2] == {"clean": True} and ev["step"][2] == 5
    assert all(v == 0 for v in log.dropped_rows.values())


def test_file_is_hdf5_110_swmr_layout(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    write_full_log(path)
    with h5py.File(path, "r") as f:
        assert f.attrs[S.ATTR_FORMAT] == S.FORMAT_NAME.encode()
        for t in S.TABLES:
            ds = f[t.name]
            assert ds.maxshape == (None,) and ds.chunks is not None
            assert not any(h5py.check_vlen_dtype(ds.dtype[n]) for n in ds.dtype.names)
    with open(path, "rb") as fh:
        assert fh.read(9)[8] == 3  # superblock version 3: the v110 format that SWMR needs


def test_writer_refuses_to_overwrite_and_bad_names(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    path.write_bytes(b"keep me")
    with pytest.raises(ConfigError) as err:
        RunLogWriter(path, {}, {})
    assert "\n" not in str(err.value) and path.read_bytes() == b"keep me"
    with RunLogWriter(path, {}, {}, overwrite=True) as w:
        with pytest.raises(ConfigError):
            w.log_event(0, "x" * (S.NAME_BYTES + 1))
        with pytest.raises(ConfigError):
            w.log_admission(0, True, "sideways", "", 0.0, 0.0, 0.0)
    assert read_run_log(path).rows("events") == 2  # run-start and run-end only


def test_exception_in_context_marks_run_end_unclean(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    with pytest.raises(RuntimeError), RunLogWriter(path, {}, {}) as w:
        w.log_step(0, step_s=1.0)
        raise RuntimeError("boom")
    detail = read_run_log(path).events["detail"][-1]
    assert detail == {"clean": False, "error": "RuntimeError: boom"}


def test_reader_drops_unflushed_tail_rows_and_rejects_damage_before_it(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    write_full_log(path)
    with h5py.File(path, "r+") as f:  # an extent that reached the file, rows that did not
        f["steps"].resize((8,))
        ev = f["events"]
        n = ev.shape[0]
        ev.resize((n + 1,))
        row = ev[n - 1]
        row["detail_off"] = f[S.HEAP].shape[0] + 10  # JSON bytes past the heap: not flushed
        ev[n] = row
    log = read_run_log(path)
    assert log.rows("steps") == 6 and log.dropped_rows["steps"] == 2
    assert log.dropped_rows["events"] == 1 and log.events["kind"][-1] == "run-end"
    with h5py.File(path, "r+") as f:
        row = f["steps"][2]
        row[S.COMMITTED] = 0
        f["steps"][2] = row
    with pytest.raises(LogFormatError, match="damaged row 2"):
        read_run_log(path)


def test_report_summary_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.h5"
    write_full_log(path, steps=6, gpus=20)  # > 16 GPUs: the memory plot is a heat map
    assert cli_main(["report", str(path), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["steps"] == 6 and s["mean_step_s"] == pytest.approx(4.5)
    assert s["median_step_s"] == pytest.approx(4.5)
    assert s["transitions"] == 1 and s["transfer_bytes"] == 123_456_789
    assert s["transition_share"] == pytest.approx(0.5 / (sum(2.0 + k for k in range(6)) + 0.5))
    assert s["admissions"] == {
        "urgent": {"admitted": 1, "rejected": 0},
        "opportunistic": {"admitted": 0, "rejected": 1},
    }
    assert s["events"] == {"run-start": 1, "node-failure": 1, "run-end": 1}
    assert [(p["first_step"], p["last_step"], p["plan_version"]) for p in s["plan_timeline"]] == [
        (0, 2, 0),
        (3, 5, 1),
    ]
    assert s["plan_timeline"][1]["plan"].startswith("actor-gen 1x1x2")
    out = tmp_path / "run_report"  # the default: next to the log
    assert [Path(p) for p in s["plots"]] == [
        out / n
        for n in ("step_latency.png", "plan_timeline.png", "gpu_memory.png", "transitions.png",
                  "stage_times.png")
    ]
    for p in s["plots"]:
        data = Path(p).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000
    assert cli_main(["report", str(path)]) == 2  # the plot folder exists: never overwritten
    assert "--out=" in capsys.readouterr().err
    assert cli_main(["report", str(path), "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert "steps: 6 (step 0..5); mean 4.500 s, median 4.500 s" in text
    assert "urgent 1 admitted / 0 rejected" in text and "steps 3..5 (3): plan 1" in text


@pytest.mark.timeout(60)
def test_damaged_metadata_fails_fast(tmp_path: Path) -> None:
    """A SWMR reader retries bad checksums with backoff; ours gives up in well under a second."""
    assert swmr_fapl() is not None
    path = valid_log(tmp_path)
    data = bytearray(path.read_bytes())
    data[2000:2400] = bytes(400)
    path.write_bytes(bytes(data))
    start = time.monotonic()
    with pytest.raises(LogFormatError):
        read_run_log(path)
    assert time.monotonic() - start < 10


def test_docs_list_every_table_and_column() -> None:
    doc = (REPO / "docs" / "log_schema.md").read_text()
    for t in S.TABLES:
        section = doc.split(f"### `/{t.name}`", 1)
        assert len(section) == 2, t.name
        body = section[1].split("###", 1)[0]
        for c in t.columns:
            assert f"| `{c.name}` |" in body, (t.name, c.name)
    attrs = (S.ATTR_FORMAT, S.ATTR_VERSION, S.ATTR_META_JSON, S.ATTR_CONFIG_JSON)
    for attr in (*attrs, S.ATTR_INITIAL_PLAN_JSON, S.ATTR_CREATED, S.ATTR_NEREUS_VERSION):
        assert f"attribute `{attr}`" in doc
    assert f"`/{S.HEAP}`" in doc


def test_reader_without_the_read_attempts_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where libhdf5 cannot be reached through ctypes, plain h5py SWMR opening is used."""
    import nereus.log.reader as reader

    monkeypatch.setattr(reader, "swmr_fapl", lambda: None)
    path = valid_log(tmp_path)
    assert read_run_log(path).rows("steps") == 6
    cut = tmp_path / "cut.h5"
    cut.write_bytes(path.read_bytes()[:3000])
    with pytest.raises(LogFormatError, match="truncated"):
        read_run_log(cut)


def test_a_continued_log_takes_new_rows_and_flushes(tmp_path: Path) -> None:
    """``append_to`` (a resumed run) flushes like a new writer: the free-space check ran on an
    attribute only ``__init__`` set, so the first flush of a continued log failed."""
    path = tmp_path / "run.h5"
    w = RunLogWriter(path, {}, {})
    w.log_event(0, "preempted", {"step": 1})
    w.close()
    w = RunLogWriter.append_to(path, {"resumed": True})
    w.log_event(1, "restart", {"step": 1})
    w.flush()
    w.close()
    kinds = [str(k) for k in read_run_log(path).events["kind"]]
    assert kinds == ["run-start", "preempted", "run-end", "run-start", "restart", "run-end"]
