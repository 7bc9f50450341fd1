"""Framed control-plane messages (nereus.runtime.mpi.frames): the frame format and its checks.
Real senders SIGKILLed at every point of a message under ULFM: tests/mpi/test_frames_mpi.py.

"""

from __future__ import annotations

import os
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
