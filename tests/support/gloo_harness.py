"""Long-lived gloo ranks on localhost for multi-process tests (spawning is the slow part)."""

from __future__ import annotations

import atexit
import queue
import socket
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pool_entry(rank: int, world: int, port: int, jobs: Any, results: Any) -> None:
    warnings.filterwarnings("ignore")
    import traceback

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    while True:
        job = jobs[rank].get()
        if job is None:
            break
        fn, args = job
        try:
            results.put((rank, True, fn(rank, world, store, *args)))
        except BaseException:
            results.put((rank, False, traceback.format_exc()))
        _drop_groups(dist)
    dist.destroy_process_group()


def _drop_groups(dist: Any) -> None:
    """Destroy every group a job registered (unit groups of the executors it built): each live
    gloo group keeps a polling thread, and a pool rank outlives hundreds of jobs."""
    import gc

    world = dist.GroupMember.WORLD
    for pg in list(dist.distributed_c10d._world.pg_map):
        if pg is not world:
            dist.destroy_process_group(pg)
    gc.collect()  # transition groups are unregistered: freed with their last reference


class GlooPool:
    """``world`` long-lived gloo ranks; :meth:`run` runs one function on all of them."""

    def __init__(self, world: int) -> None:
        self.world = world
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        world = self.world
        self.jobs = [ctx.Queue() for _ in range(world)]
        self.results = ctx.Queue()
        port = free_port()
        self.procs = [ctx.Process(target=_pool_entry, args=(r, world, port, self.jobs,
                                                            self.results), daemon=True)
                      for r in range(world)]
        for p in self.procs:
            p.start()

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float = 180.0,
            dying: tuple[int, ...] = ()) -> list[Any]:
        """Run ``fn`` on every rank; ranks in ``dying`` are expected to exit without a result."""
        for q in self.jobs:
            q.put((fn, args))
        out: list[Any] = [None] * self.world
        errors = []
        for _ in range(self.world - len(dying)):
            try:
                rank, ok, value = self.results.get(timeout=timeout_s)
            except queue.Empty:
                self._kill()
                self._start()
                raise AssertionError(f"ranks gave no result within {timeout_s} s") from None
            if ok:
                out[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
        if errors:  # the ranks may now disagree on group state: start fresh ones
            self._kill()
            self._start()
            raise AssertionError("\n".join(errors))
        return out

    def _kill(self) -> None:
        for p in self.procs:
            p.kill()
            p.join(timeout=20)

    def close(self) -> None:
        for q in self.jobs:
            q.put(None)
        for p in self.procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()


_POOLS: dict[int, GlooPool] = {}


def shared_pool(world: int) -> GlooPool:
    """One pool per world size for the whole pytest session (spawning ranks is the slow part)."""
    if world not in _POOLS:
        _POOLS[world] = GlooPool(world)
        atexit.register(_POOLS[world].close)
    return _POOLS[world]


def discard_pool(world: int) -> None:
    """Kill a pool whose ranks can no longer agree (e.g. after a rank was killed on purpose)."""
    pool = _POOLS.pop(world, None)
    if pool is not None:
        pool._kill()
