"""Which process runs a job: an owner string, and whether that process is still alive."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def process_owner() -> str:
    """``host:pid:start`` of this process; the start time tells a reused pid apart."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_ticks(os.getpid()) or 0}"


def owner_alive(owner: str) -> bool | None:
    """Whether the process named by ``owner`` still runs: True or False on this host, None when
    it ran on another host (this process cannot tell). An empty owner is never alive.

    >>> owner_alive(process_owner())
    True
    >>> owner_alive("")
    False
    """
    host, _, rest = owner.partition(":")
    pid_text, _, start = rest.partition(":")
    if not owner or not pid_text.isdigit():
        return False
    if host != socket.gethostname():
        return None
    return _start_ticks(int(pid_text)) == (start or None)
