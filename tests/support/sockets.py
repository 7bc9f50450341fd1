"""The TCP sockets a process listens on, read from /proc (Linux): its socket inodes
(``/proc/<pid>/fd``) matched with the LISTEN rows of ``/proc/net/tcp`` and ``/proc/net/tcp6``."""

from __future__ import annotations

import os
from dataclasses import dataclass

LISTEN = "0A"  # the kernel's TCP_LISTEN state in /proc/net/tcp*


@dataclass(frozen=True, order=True)
class Listener:
    family: str  # "tcp" or "tcp6"
    address: str  # the bound address as the kernel prints it (hex)
    port: int
    inode: int

    @property
    def wildcard(self) -> bool:
        """Bound to every interface (0.0.0.0 or ::)."""
        return set(self.address) == {"0"}

    def __str__(self) -> str:
        return f"{self.family}:{'*' if self.wildcard else self.address}:{self.port}"


def socket_inodes(pid: int | str = "self") -> set[int]:
    out = set()
    fds = f"/proc/{pid}/fd"
    for fd in os.listdir(fds):
        try:
            target = os.readlink(os.path.join(fds, fd))
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            out.add(int(target[len("socket:["):-1]))
    return out


def listening(pid: int | str = "self") -> set[Listener]:
    """Every TCP socket of process ``pid`` in the LISTEN state."""
    mine = socket_inodes(pid)
    out = set()
    for family in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{family}", encoding="ascii") as fh:
            rows = fh.read().splitlines()[1:]
        for row in rows:
            f = row.split()
            if f[3] != LISTEN or int(f[9]) not in mine:
                continue
            address, port = f[1].rsplit(":", 1)
            out.add(Listener(family, address, int(port, 16), int(f[9])))
    return out
