"""Error boxes as Open MPI's mpiexec (PRRTE) prints them when its runtime dies (hosts n1..n3),
for pure/test_run_launch_reason.py and mpi/test_run_launch_retry.py."""

from __future__ import annotations

LOST = """[n1:01234] PRTE ERROR: Unreachable in file plm_base_launch_support.c
--------------------------------------------------------------------------
PRTE has lost communication with a remote daemon.

  HNP daemon   : [prterun-n1-4321@0,0] on node n1
  Remote daemon: [prterun-n1-4321@0,1] on node n2

This is usually due to either a failure of the TCP network
connection to the node, or possibly an internal failure of
the daemon itself. We cannot recover from this failure, and
therefore will terminate the job.
--------------------------------------------------------------------------
"""
KILLED = """--------------------------------------------------------------------------
prterun noticed that process rank 2 with PID 0 on node n3 exited on
signal 9 (Killed).
--------------------------------------------------------------------------
"""
