"""A rank's start-up facts agreed with every other rank: a function run on every rank whose
first failure is raised on all of them, the rank's device binding and every rank's placement
(framed MPI all-gathers), the log's record of them, and the largest value over the ranks.
Effectful (MPI, torch); used by the rank program (:mod:`nereus.runtime.worker.main`)."""

from __future__ import annotations

from typing import Any


def agreed(plane: Any, fn: Any) -> Any:
    """Run ``fn`` on every rank; raise the first failure on every rank."""
    from nereus.errors import NereusError

    out, err, kind = None, "", ""
    try:
        out = fn()
    except NereusError as e:
        err, kind = str(e), type(e).__name__
    except Exception as e:  # reported on every rank by agree
        err, kind = f"{type(e).__name__}: {e}", "Exception"
    plane.agree(not err, f"{kind}|{err}")
    return out


def bind_device(plane: Any, comm: Any, rc: Any, setup: Any) -> tuple[Any, Any]:
    """Every rank: its device from the job environment and the node's inventory (agreed: a
    ``runtime.device: cuda`` without a GPU is the same one-line error on every rank), bound
    (``torch.cuda.set_device``) before any group or model exists; every rank's placement
    (MPI all-gather), so every rank computes the same transports; ``runtime.generation: auto``
    resolved as rank 0 sees it. Returns the rank's :class:`RankDevice` and the run config."""
    from dataclasses import replace

    from nereus.cluster.devices import select_device
    from nereus.cluster.env import from_os_environ
    from nereus.cluster.probe import device_facts
    from nereus.cluster.transport import RankPlacement
    from nereus.config.run import resolve_generation
    from nereus.runtime.execution.device import RankDevice
    from nereus.runtime.mpi import frames

    def choose() -> Any:
        job = from_os_environ()
        choice = select_device(rc.device, device_facts(job), setup.cluster.gpu.vendor)
        if choice.on_gpu and rc.train_engine == "deepspeed":
            from nereus.errors import ConfigError

            raise ConfigError("runtime.train_engine", "deepspeed",
                              "runs on CPU ranks only (set runtime.device: cpu)")
        if choice.on_gpu:
            import torch

            from nereus.engines.megatron_model import prepare_device

            torch.cuda.set_device(choice.index)
            prepare_device(rc.seed)
        return choice, job.node_name or hostname()

    choice, node = agreed(plane, choose)
    mine = RankPlacement.of(plane.global_rank, node, choice)
    played = setup.cluster.gpu_of(plane.global_rank).label
    if not choice.on_gpu and played:  # a CPU rank playing a vendor (cluster.nodes[i].vendor)
        mine = replace(mine, vendor=played)
    placed = frames.allgather(comm, mine.to_dict(), "placement")
    placements = tuple(RankPlacement.from_dict(p) for p in placed)
    dev = RankDevice(choice, placements, plane.global_rank)

    def generation() -> Any:
        from nereus.engines.vllm_engine import vllm_unavailable_reason

        on_gpu = all(p.kind == "cuda" for p in placements)
        return resolve_generation(rc.generation, on_gpu, on_gpu and
                                  vllm_unavailable_reason() is None, setup)

    engine, why = frames.bcast(comm, list(generation()) if plane.is_root else None, 0,
                               "generation")
    dev.generation_reason = why
    return dev, replace(rc, generation=engine)


def hostname() -> str:
    import socket

    return socket.gethostname()


def devices_event(dev: Any, rc: Any) -> dict[str, Any]:
    """The log's record of where the ranks run (event ``devices``)."""
    from nereus.cluster.transport import default_backend

    return {"placements": [p.to_dict() for p in dev.placements],
            "rank0": dev.choice.to_dict(), "default_backend": default_backend(dev.placements),
            "dtype": str(dev.dtype).removeprefix("torch."), "pack": dev.packer.name,
            "generation": rc.generation, "generation_reason": dev.generation_reason}


def max_over_ranks(comm: Any, value: float) -> float:
    """The largest ``value`` of all ranks (a buffer-based MPI_Allreduce: nothing pickled)."""
    import numpy as np
    from mpi4py import MPI

    out = np.zeros(1)
    comm.Allreduce(np.array([value], dtype=np.float64), out, op=MPI.MAX)
    return float(out[0])
