"""The run log's scalars in TensorBoard: written live through the writer's observer and converted
from a finished log (``nereus report --tensorboard``), both read back equal to the log's values
(double precision)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from nereus.config.outputs import OutputOptions
from nereus.errors import ConfigError
from nereus.log.reader import read_run_log
from nereus.log.scalars import plan_scalars, scalars
from nereus.log.sinks import Sinks, TensorBoardSink, check_sinks, log_rows, write_tensorboard
from nereus.log.writer import RunLogWriter

PLAN = {"stages": [{"name": "actor-gen", "tp": 1, "pp": 1, "dp": 2, "micro_batch": 4,
                    "grad_accum": 1, "recompute": False, "replicas": [[0], [1]]}]}
NEW_PLAN = {"stages": [{**PLAN["stages"][0], "tp": 2, "dp": 1, "replicas": [[0, 1]]}]}


def _read(folder: Path) -> dict[tuple[str, int], float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    out: dict[tuple[str, int], float] = {}
    for events in sorted(folder.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"tensors": 0})
        acc.Reload()
        for tag in acc.Tags()["tensors"]:
            for ev in acc.Tensors(tag):
                out[(tag, ev.step)] = float(tensor_util.make_ndarray(ev.tensor_proto))
    return out


def _write_run(w: RunLogWriter) -> None:
    for step in range(3):
        w.log_step(step, step_s=1.0 / 3 + step, gen_len_mean=7.1 + step, gen_len_p95=9.9,
                   pool_gpus=2, stage_s={"actor-gen": 0.123456789}, reward=0.1 * step + 1e-9,
                   tokens=100 + step, flush=False)
        w.log_row("metrics", {"step": step, "name": "loss/actor-train", "value": -0.3 / 7})
        w.log_row("metrics", {"step": step, "name": "kl", "value": 1e-5 * step})
        w.log_stage_time(step, "actor-gen", 0.1, 0.123456789)
        w.flush()
    w.log_transition(1, {"kind": "urgent"}, [], 1234, 0.5, 0.75, plan=NEW_PLAN)
    w.log_row("validation", {"step": 2, "prompts": 4, "reward": 0.25, "pass_at_1": 0.5,
                             "len_mean": 3.5, "samples": 0, "sampled_reward": math.nan,
                             "sampled_pass_at_1": math.nan, "pass_at_k": math.nan, "errors": 0,
                             "seconds": 0.2, "detail": {}})
    w.flush()


def test_live_and_converted_scalars_read_back_equal_to_the_log(tmp_path: Path) -> None:
    sinks = Sinks([TensorBoardSink(str(tmp_path / "live"))])
    w = RunLogWriter(tmp_path / "run.h5", {"kind": "test"}, {}, initial_plan=PLAN)
    w.observers.append(sinks.row)
    sinks.plan(PLAN, 0)
    _write_run(w)
    w.close()
    sinks.close()
    log = read_run_log(tmp_path / "run.h5")
    want = {(tag, s): v for tag, s, v in plan_scalars(log.initial_plan, 0)}
    for table, row in log_rows(log):
        want.update({(tag, s): v for tag, s, v in scalars(table, row)})
    assert _read(tmp_path / "live") == want
    assert write_tensorboard(log, str(tmp_path / "converted")) == len(want)
    assert _read(tmp_path / "converted") == want
    # the values are the log's columns, exactly
    assert [want[("reward/mean", s)] for s in range(3)] == list(log.steps["reward"])
    assert want[("time/step_s", 0)] == 1.0 / 3 and want[("loss/actor-train", 2)] == -0.3 / 7
    assert want[("calibration/error/actor-gen", 1)] == 0.1 / 0.123456789 - 1.0
    assert want[("transition/bytes", 1)] == 1234 and want[("plan/actor-gen/tp", 2)] == 2.0
    assert want[("plan/actor-gen/dp", 0)] == 2.0 and want[("val/pass@1", 2)] == 0.5
    assert ("val/pass@k", 2) not in want  # NaN: no samples


def test_tensorboard_folders_are_never_written_over(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    check_sinks(OutputOptions(tensorboard="tb"), resuming=False)
    assert list(tmp_path.iterdir()) == []  # nothing made by the check
    (tmp_path / "tb").mkdir()
    with pytest.raises(ConfigError, match="exists"):
        check_sinks(OutputOptions(tensorboard="tb"), resuming=False)
    check_sinks(OutputOptions(tensorboard="tb"), resuming=True)  # a resumed run: its own
    with pytest.raises(ConfigError, match="its directory does not exist"):
        check_sinks(OutputOptions(tensorboard="no/tb"), resuming=False)
