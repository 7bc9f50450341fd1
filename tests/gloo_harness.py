"""Spawn gloo ranks on localhost for multi-process tests; results come back as pickles."""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, world: int, port: int, out_dir: str, fn: Callable[..., Any],
           args: tuple[Any, ...]) -> None:
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    result = fn(rank, world, store, *args)
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    """Run ``fn(rank, world, store, *args)`` on ``world`` gloo ranks; return per-rank results.

    A rank that exits without a result (killed on purpose) yields None.
    """
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(_entry, args=(world, free_port(), out_dir, fn, args), nprocs=world,
                           join=True, start_method="spawn")
        out: list[Any] = []
        for r in range(world):
            path = os.path.join(out_dir, f"rank{r}.pkl")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    out.append(pickle.load(f))
            else:
                out.append(None)
        return out
