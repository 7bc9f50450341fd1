"""No MPI job: what ``nereus run`` does when mpiexec itself dies (mpi tier: ``nereus run`` checks
``mpiexec --version`` before it launches).

The launch is replaced here (a real PRRTE cannot be made to lose a daemon on demand); the
decisions around it are ``nereus run``'s own: a runtime that died before any rank wrote the run
log is launched again on the same nodes and log (nothing ran; ``runtime.failures.launch_retries``
counts it, apart from the checkpoint relaunches), and every error line says what mpiexec said
(the first paragraph of its last error box)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.mpiexec_output import LOST

from nereus.cli import build_parser
from nereus.commands import run as run_cmd
from nereus.runtime.failures.relaunch import mpiexec_reason

pytestmark = pytest.mark.skipif(shutil.which("mpiexec") is None,
                                reason="nereus run checks for mpiexec before launching")
JOB = """job: {algorithm: ppo, mode: sync, global_batch: 12, minibatches: 2, prompt_len: 8,
      gen_len: 16, reward_model: false}
models: {actor: tiny-gpt, critic: tiny-gpt, reference: tiny-gpt}
cluster: {nodes: 2, gpus_per_node: 1, gpu: cpu, memory_per_gpu_gb: 0.5}
"""


def _args(tmp: Path, runtime: str) -> argparse.Namespace:
    cfg = tmp / "job.yaml"
    cfg.write_text(JOB + f"runtime: {{steps: 1, {runtime}}}\n")
    return build_parser().parse_args(["run", str(cfg), "--log", str(tmp / "run.h5")])


def _fake_launches(monkeypatch: pytest.MonkeyPatch, outcomes: list[tuple[Any, ...]]
                   ) -> list[str]:
    """Each launch in turn: (exit status, what mpiexec said, whether the ranks wrote the log[,
    the first rank error])."""
    logs: list[str] = []

    def launch(args: Any, rc: Any, log: str, *rest: Any) -> tuple[int, str, str]:
        code, said, wrote, *error = outcomes[len(logs)]
        logs.append(log)
        if wrote:
            Path(log).write_bytes(b"")
        return code, error[0] if error else "", said

    monkeypatch.setattr(run_cmd, "_launch", launch)
    return logs


LISTENER = ("The PMIx server's listener thread failed to start. We cannot continue.")


def test_a_runtime_that_died_before_the_ranks_started_is_launched_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args(tmp_path, "adapt: false")  # no failures section: no checkpoint, no relaunch
    logs = _fake_launches(monkeypatch, [(213, LISTENER, False), (213, LISTENER, False),
                                        (0, "", True)])
    assert run_cmd.handler(args) == 0
    assert logs == [str(tmp_path / "run.h5")] * 3  # the same log: nothing had been written
    err = capsys.readouterr().err.splitlines()
    assert err == [f"nereus: the MPI runtime died before the ranks started (mpiexec exit 213: "
                   f"{LISTENER}); launch again {k}/2" for k in (1, 2)]


def test_start_up_retries_are_counted_apart_from_checkpoint_relaunches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A start-up death, then a death mid-run (the log written): the one relaunch is still there
    for it, and is tried (it needs a checkpoint, which this run has not written: one error)."""
    args = _args(tmp_path, "failures: {checkpoint_every: 1, relaunch: 1, launch_retries: 1}")
    said = mpiexec_reason(LOST.splitlines())
    logs = _fake_launches(monkeypatch, [(213, LISTENER, False), (1, said, True)])
    with pytest.raises(run_cmd.LaunchError) as err:
        run_cmd.handler(args)
    assert len(logs) == 2
    assert "launch again 1/1" in capsys.readouterr().err
    assert str(err.value).startswith("rank failure: the MPI runtime died (mpiexec exit 1: PRTE "
                                     "has lost communication with a remote daemon.); nodes lost")
    assert "no checkpoint in" in str(err.value)


def test_without_a_retry_left_the_error_says_what_mpiexec_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = _args(tmp_path, "failures: {launch_retries: 1}")
    said = mpiexec_reason(LOST.splitlines())
    logs = _fake_launches(monkeypatch, [(213, said, False), (213, said, False)])
    with pytest.raises(run_cmd.LaunchError) as err:
        run_cmd.handler(args)
    assert len(logs) == 2
    assert str(err.value) == ("rank failure: mpiexec exited with status 213 (PRTE has lost "
                              "communication with a remote daemon.)")


SHRUNK = ("rank 2: RankFailure: the survivors could not shrink the MPI communicator: "
          "MPI_ERR_PROC_FAILED")


def test_survivors_that_could_not_recover_are_relaunched_from_the_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ULFM could not shrink the survivors' communicator: they say so and end; as after a
    runtime death, only a relaunch from the checkpoint can go on."""
    from support.resume_files import write_checkpoint

    args = _args(tmp_path, "failures: {checkpoint_every: 1}")
    # the checkpoint of the boundary before step 0, as this job writes it (the relaunch checks
    # it whole against the job before it starts the ranks)
    write_checkpoint(tmp_path / "run.h5.ckpt", Path(args.config), tmp_path / "run.h5", 0)
    logs = _fake_launches(monkeypatch, [(4, "", True, SHRUNK), (0, "", True)])
    assert run_cmd.handler(args) == 0
    assert logs == [str(tmp_path / "run.h5"), str(tmp_path / "run.relaunch-1.h5")]
    told = [ln for ln in capsys.readouterr().err.splitlines() if "relaunch 1/1" in ln]
    assert len(told) == 1 and told[0].startswith(
        f"nereus: the survivors could not recover ({SHRUNK}); nodes lost: none"), told


def test_a_rank_error_of_the_job_is_not_relaunched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = _args(tmp_path, "failures: {checkpoint_every: 1}")
    logs = _fake_launches(monkeypatch, [(4, "", True, "rank 1: ValueError: bad batch")])
    with pytest.raises(run_cmd.LaunchError) as err:
        run_cmd.handler(args)
    assert len(logs) == 1 and str(err.value) == "rank failure: rank 1: ValueError: bad batch"
