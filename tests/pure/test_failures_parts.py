"""The parts of rank-failure survival that need no MPI job: boundary agreement, surviving
replicas, the survivors' renumbered cluster, the failure config, checkpoint files, and the
classification of errors as consequences of a dead peer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nereus.config.failures import FailureOptions, Kill, parse_failures
from nereus.errors import ConfigError
from nereus.runtime.failures.boundary import Boundary, BoundaryBook, surviving_replica
from nereus.runtime.failures.checkpoint import latest_global, read_history, save_global
from nereus.runtime.failures.recovery import surviving_node_map, survivor_setup
from nereus.runtime.failures.ulfm import secondary
from nereus.runtime.worker.state import Counters
from nereus.spec.plan import ExecutionPlan, StagePlan


def _boundary(step: int, version: int) -> Boundary:
    return Boundary(step, version, ExecutionPlan(()), {})


def test_book_keeps_two_and_survivors_agree_on_the_older_latest() -> None:
    book = BoundaryBook()
    for key in ((0, 0), (1, 0), (1, 1)):
        book.record(_boundary(*key))
    assert [b.key for b in book.kept] == [(1, 0), (1, 1)]
    # What agree_boundary all-gathers: every survivor's latest key, this rank's among them.
    # Another survivor did not get the plan change: both fall back to (1, 0).
    assert book.oldest_of([book.latest(), [1, 0], [1, 1]]).key == (1, 0)
    assert book.oldest_of([book.latest(), [1, 1]]).key == (1, 1)
    with pytest.raises(KeyError):  # never more than one boundary apart
        book.oldest_of([book.latest(), [0, 0]])


def _stage(name: str, replicas: tuple[tuple[int, ...], ...], tp: int = 1) -> StagePlan:
    return StagePlan(name=name, tp=tp, pp=1, dp=len(replicas), micro_batch=1, grad_accum=1,
                     replicas=replicas)


def test_surviving_replica_needs_all_of_its_ranks() -> None:
    plan = ExecutionPlan((_stage("actor-train", ((0, 1), (2, 3)), tp=2),))
    assert surviving_replica(plan, "actor-train", (0, 1, 2, 3)) == 0
    assert surviving_replica(plan, "actor-train", (1, 2, 3)) == 1
    assert surviving_replica(plan, "actor-train", (0, 3)) is None


def test_survivors_are_renumbered_onto_whole_nodes(tmp_path: Path) -> None:
    from nereus.config.load import load_config

    cfg = tmp_path / "c.yaml"
    cfg.write_text("job: {algorithm: ppo, mode: sync, global_batch: 12, prompt_len: 8, "
                   "gen_len: 16, reward_model: false}\n"
                   "models: {actor: tiny-gpt, critic: tiny-gpt, reference: tiny-gpt}\n"
                   "cluster: {nodes: 3, gpus_per_node: 2, gpu: cpu, memory_per_gpu_gb: 0.5}\n")
    setup = load_config(str(cfg)).setup
    new, renumber = survivor_setup(setup, (0, 1, 4, 5))
    assert new.cluster.nodes == 2 and new.cluster.gpus_per_node == 2
    assert renumber == {0: 0, 1: 1, 4: 2, 5: 3}
    assert surviving_node_map(setup, renumber) == {0: 0, 2: 1}  # node 1 died; node 2 is now node 1
    assert new.cluster.gpu == setup.cluster.gpu and new.job == setup.job


def test_failure_config_checks_kills() -> None:
    opts = parse_failures({"checkpoint_every": 2, "kill": [
        {"node": 1, "at_step": 3, "phase": "transition", "after_s": 0.5}]}, nodes=2, steps=5)
    assert opts.kill == (Kill(1, 3, "transition", 0.5),) and opts.checkpoint_every == 2
    assert opts.kills_at(1, 3, "transition") and not opts.kills_at(1, 3, "step")
    for bad, field in (({"kill": [{"node": 2, "at_step": 0}]}, "node"),
                       ({"kill": [{"node": 0, "at_step": 5}]}, "at_step"),
                       ({"kill": [{"node": 0, "at_step": 0, "phase": "x"}]}, "phase"),
                       ({"checkpoint_every": -1}, "checkpoint_every"),
                       ({"kill": [{"node": 0, "at_step": 0, "runtime": "yes"}]}, "runtime"),
                       ({"relaunch": 1}, "relaunch"),  # nothing to resume from
                       ({"checkpoint_every": 1, "relaunch_wait_s": -1}, "relaunch_wait_s"),
                       ({"every": 1}, "runtime.failures")):
        with pytest.raises(ConfigError, match=field):
            parse_failures(bad, nodes=2, steps=5)
    assert parse_failures({"checkpoint_every": 1}, nodes=2, steps=5).relaunch == 1
    assert parse_failures({}, nodes=2, steps=5).relaunch == 0
    opts = parse_failures({"checkpoint_every": 1, "relaunch": 3, "kill": [
        {"node": 1, "at_step": 0, "runtime": True}]}, nodes=2, steps=5)
    assert opts.relaunch == 3 and opts.kill[0].runtime
    assert FailureOptions.from_dict(opts.to_dict()) == opts


def test_survivor_config_renumbers_nodes_and_resumes(tmp_path: Path) -> None:
    from nereus.runtime.failures.relaunch import (
        recovery_failed,
        runtime_died,
        runtime_kills,
        surviving_nodes,
        survivor_config,
    )

    raw = {"cluster": {"nodes": 4, "gpus_per_node": 2},
           "runtime": {"ranks": 8, "late_nodes": 1,
                       "events": [{"at_step": 1, "remove_node": 1}, {"at_step": 3, "add_node": 3},
                                  {"at_step": 2, "remove_node": 2}],
                       "failures": {"checkpoint_every": 1, "kill": [
                           {"node": 2, "at_step": 1, "runtime": True},
                           {"node": 3, "at_step": 3}]}}}
    out = survivor_config(raw, (0, 1, 3), "/ck")
    assert raw["cluster"]["nodes"] == 4  # the original is not touched
    assert out["cluster"] == {"nodes": 3, "gpus_per_node": 2}
    rt = out["runtime"]
    assert "ranks" not in rt and rt["late_nodes"] == 1
    assert rt["events"] == [{"at_step": 1, "remove_node": 1}, {"at_step": 3, "add_node": 2}]
    assert rt["failures"]["resume"] == rt["failures"]["checkpoint_dir"] == "/ck"
    assert rt["failures"]["kill"] == [{"node": 2, "at_step": 3}]
    # who survived: injected runtime deaths without Slurm, the allocation's usable nodes with it
    log = str(tmp_path / "run.h5")
    (tmp_path / "run.h5.kills").write_text("4 1.0 runtime\n5 1.0 runtime\n")
    assert runtime_kills(log) == [4, 5]
    names = ("n1", "n2", "n3")
    assert surviving_nodes(names, 2, log, slurm_pool=None, wait_s=0)[0] == (0, 1)
    polls = iter([("n1", "n2", "n3"), ("n1", "n3")])
    alive, how = surviving_nodes(names, 2, log, slurm_pool=lambda: next(polls), wait_s=30,
                                 poll_s=0)
    assert alive == (0, 2) and how == "Slurm"
    alive, how = surviving_nodes(names, 2, log, slurm_pool=lambda: names, wait_s=0)
    assert alive == (0, 1, 2) and "no lost node" in how
    assert runtime_died(-9, "", (2, 3)) and not runtime_died(4, "rank 1: X", (2, 3))
    assert not runtime_died(2, "", (2, 3)) and not runtime_died(0, "", (2, 3))
    shrunk = "rank 1: RankFailure: the survivors could not shrink the MPI communicator: x"
    assert recovery_failed(4, shrunk) and not recovery_failed(0, shrunk)
    assert not recovery_failed(4, "rank 1: RankFailure: no plan fits the 2 surviving ranks")


def test_checkpoint_round_trip_and_newest_wins(tmp_path: Path) -> None:
    assert latest_global(str(tmp_path / "none")) is None
    globs = {"actor-train": {"param": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}}}
    counters = {"actor-train": (Counters(updates=4, position=4), 4.0)}
    save_global(str(tmp_path), 2, globs, counters)
    globs["actor-train"]["param"]["w"] += 1
    save_global(str(tmp_path), 4, globs, counters)
    (tmp_path / "step-00000006.npz.part.npz").write_bytes(b"half written")
    got = latest_global(str(tmp_path))
    assert got is not None
    path, step, g, c = got
    assert step == 4 and path.endswith("step-00000004.npz")
    np.testing.assert_array_equal(g["actor-train"]["param"]["w"], globs["actor-train"]["param"]["w"])
    assert c == counters
    assert read_history(path) is None  # written without a record
    rows = [{"step": 0, "reward": np.float32(0.25), "losses": {"actor-train": 0.5}, "plan": "p"}]
    save_global(str(tmp_path), 6, globs, counters,
                {"rows": rows, "transitions": 1, "transition_s": 0.5})
    newest = latest_global(str(tmp_path))
    assert newest is not None and newest[1] == 6
    assert read_history(newest[0]) == {"rows": [{**rows[0], "reward": 0.25}], "transitions": 1,
                                       "transition_s": 0.5}


def test_secondary_errors() -> None:
    from mpi4py import MPI

    assert secondary(MPI.Exception(MPI.ERR_OTHER))
    assert secondary(RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer"))
    assert not secondary(RuntimeError("injected failure (runtime.inject_failure) at step 1"))
    assert not secondary(KeyError("actor-train"))
    from nereus.runtime.mpi.frames import FrameError

    # rank 0 killed during the controller-replica broadcast: the others got a torn frame
    assert secondary(FrameError("control plane: replica message from the root: checksum "
                                "mismatch"))
