"""What ``nereus run`` says when mpiexec itself dies (the first paragraph of its last error box),
and the ``launch_retries`` rule; the launch decisions themselves: mpi/test_run_launch_retry.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.mpiexec_output import KILLED, LOST

from nereus.runtime.failures.relaunch import mpiexec_reason


def test_mpiexec_reason_is_the_first_paragraph_of_its_last_box() -> None:
    assert mpiexec_reason(LOST.splitlines()) == ("PRTE has lost communication with a remote "
                                                 "daemon.")
    assert mpiexec_reason((LOST + KILLED).splitlines()) == (
        "prterun noticed that process rank 2 with PID 0 on node n3 exited on signal 9 "
        "(Killed).")
    assert mpiexec_reason(["warming up", "bind: address in use"]) == "bind: address in use"
    assert mpiexec_reason([]) == ""


def test_launch_retries_is_checked(tmp_path: Path) -> None:
    from nereus.config.failures import parse_failures
    from nereus.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_failures({"launch_retries": -1}, nodes=2, steps=1)
    assert "runtime.failures.launch_retries" in str(err.value)
    assert parse_failures(None, nodes=2, steps=1).launch_retries == 2
