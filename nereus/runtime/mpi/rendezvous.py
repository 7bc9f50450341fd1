"""torch.distributed rendezvous through a job-private file store, announced over the MPI control plane.

Nothing listens for the rendezvous: no ``TCPStore`` (which would accept, on every interface and
without authentication, whatever a peer on the network writes into the job's keys). Rank 0 of
the communicator creates a fresh file for the generation (``O_EXCL``, mode 0600) in the job's
*store folder* — a directory only the job's user can enter (mode 0700, owned by that user, not a
symbolic link) — and broadcasts its name in a framed ``rendezvous`` message of the control
plane (:mod:`nereus.runtime.mpi.plane`); every rank checks the folder itself, then opens a
``torch.distributed.FileStore`` on the file and joins ``init_process_group`` with it. Gloo's
address exchange, NCCL's (RCCL's) unique id and every later group of the generation (unit
groups, transition groups, cached device communicators) go through that file. Every rank
agrees on every outcome (:meth:`ControlPlane.agree`): a failure on one rank is the same error
on all of them. A rank that never arrives fails the others after ``timeout_s`` (the store's
waits are bounded by it, as the group's collectives are).

The store folder (:class:`StoreFolder`): the one ``nereus run`` creates and passes
(``--rendezvous-dir``; it removes it after the ranks ended), or else one rank 0 creates at the
first rendezvous — under ``$TMPDIR`` when every rank runs on its host, in ``shared_parent``
(the run log's folder, which the hosts must then share) when the ranks span hosts — and
:func:`finish` removes at the end of the job. Every rank learns the folder from the message, so
a survivor or a spawned rank that later roots a rendezvous knows it.

A new generation — the survivors of dead ranks on a shrunk communicator, or the merged
communicator after ranks were spawned for late nodes — uses a new file; its root removes the
previous generation's file (every rank of the new generation dropped that group first). A
store file outlives its generation only when a rank died holding it; the folder's removal takes
it. Multi-host jobs therefore need a shared file system that supports ``flock`` for the folder.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import shutil
import socket
import stat
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from nereus.errors import CommunicationError
from nereus.runtime.mpi.frames import allgather
from nereus.runtime.mpi.plane import ControlPlane, Message

FOLDER_PREFIX = "nereus-rendezvous-"


@dataclass
class StoreFolder:
    """The job's store folder as this rank knows it (learnt from each rendezvous message).

    ``owned``: created by the ranks (removed by :func:`finish`), not given by the launcher;
    ``file``: the current generation's store file, a name inside ``path``."""

    path: str = ""
    owned: bool = False
    file: str = ""

    def store_path(self) -> str:
        return os.path.join(self.path, self.file)

    def remove(self) -> None:
        """Remove the folder if the ranks created it (best effort)."""
        if self.owned and self.path:
            shutil.rmtree(self.path, ignore_errors=True)


@dataclass(frozen=True)
class RendezvousInfo:
    path: str  # the generation's store file
    generation: int
    world_size: int


def private_problem(path: str) -> str:
    """Why ``path`` is not a private store folder of this user here ("" when it is one)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"{path}: {e.strerror or e} (a job spanning hosts needs a folder they share)"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{path}: not a directory (a symbolic link or another file)"
    if st.st_uid != os.geteuid():
        return f"{path}: owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o077:
        return (f"{path}: mode {stat.S_IMODE(st.st_mode):04o}: others may enter it "
                "(a store folder is 0700)")
    return ""


def new_folder(spanning: bool, shared_parent: str) -> str:
    """A fresh store folder (mode 0700): in ``shared_parent`` when the ranks span hosts, else
    in the temporary directory (``$TMPDIR``)."""
    if spanning:
        if not shared_parent:
            raise CommunicationError("rendezvous: the ranks span hosts and no shared folder "
                                     "was given for the store (the run log's folder)")
        return tempfile.mkdtemp(prefix=f".{FOLDER_PREFIX}", dir=shared_parent)
    return tempfile.mkdtemp(prefix=FOLDER_PREFIX)


def _root_prepare(folder: StoreFolder, generation: int, spanning: bool,
                  shared_parent: str) -> str:
    """Rank 0: the folder (created if none is known), the previous file removed, a new one."""
    if not folder.path:
        folder.path, folder.owned = new_folder(spanning, shared_parent), True
    problem = private_problem(folder.path)
    if problem:
        raise CommunicationError(f"rendezvous: store folder {problem}")
    if folder.file:  # the previous generation's: every rank of this one dropped its group
        with contextlib.suppress(OSError):
            os.remove(folder.store_path())
    name = f"store-g{generation}-{secrets.token_hex(8)}"
    fd = os.open(os.path.join(folder.path, name),
                 os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
    os.close(fd)
    return name


def rendezvous(
    plane: ControlPlane,
    folder: StoreFolder,
    generation: int,
    backend: str = "gloo",
    timeout_s: float = 60.0,
    shared_parent: str = "",
) -> RendezvousInfo:
    """Create the default torch.distributed group of all ranks of ``plane`` (collective).

    ``folder``: the job's store folder as this rank knows it (empty on a rank that never took
    part in a rendezvous; rank 0 creates one if it knows none); updated from rank 0's message.
    ``shared_parent``: where rank 0 creates a folder when the ranks span hosts."""
    import torch.distributed as dist

    hosts = allgather(plane.comm, socket.gethostname(), "rendezvous-hosts")
    msg = None
    if plane.is_root:
        payload: dict[str, Any] = {"generation": generation, "error": ""}
        try:
            name = _root_prepare(folder, generation, len(set(hosts)) > 1, shared_parent)
            payload.update(folder=folder.path, owned=folder.owned, file=name)
        except (OSError, CommunicationError) as e:
            payload["error"] = str(e) if isinstance(e, CommunicationError) else (
                f"rendezvous: creating the store file in {folder.path or 'a new folder'}: {e}")
        msg = Message("rendezvous", plane.next_seq(), payload)
    got = plane.broadcast(msg, "rendezvous").payload  # the same message on every rank
    if got["error"]:
        raise CommunicationError(f"rank {plane.root}: {got['error']}")
    folder.path, folder.owned, folder.file = str(got["folder"]), bool(got["owned"]), str(got["file"])
    problem = "" if plane.is_root else private_problem(folder.path)
    plane.agree(not problem, f"rendezvous on host {socket.gethostname()}: store folder {problem}")
    info = RendezvousInfo(folder.store_path(), int(got["generation"]), plane.world_size)
    error = ""
    try:
        store = dist.FileStore(info.path, plane.world_size)
        store.set_timeout(timedelta(seconds=timeout_s))
        dist.init_process_group(backend, store=store, rank=plane.global_rank,
                                world_size=plane.world_size, timeout=timedelta(seconds=timeout_s))
    except Exception as exc:  # reported on every rank below
        error = (f"rendezvous of generation {info.generation} ({backend}, {timeout_s:g} s): "
                 f"{type(exc).__name__}: {exc}")
    plane.agree(not error, error)
    return info


def teardown(group: Any = None) -> None:
    """Destroy ``group`` (or the default group) if it exists; its store is released with it."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    try:
        dist.destroy_process_group(group)
    except Exception as exc:
        raise CommunicationError(f"destroying process group: {exc}") from None
    gc.collect()  # groups of the generation dropped by the caller hold the store too


def finish(comm: Any, folder: StoreFolder, is_root: bool) -> None:
    """End of the job on every rank: a folder the ranks created is removed by the root once
    every rank is past its last group (a folder the launcher gave is the launcher's to remove).
    A failed barrier (a rank died at the very end) still removes it."""
    if not folder.owned:
        return
    gc.collect()
    with contextlib.suppress(Exception):
        comm.Barrier()
    if is_root:
        folder.remove()
