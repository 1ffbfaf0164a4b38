"""Who runs a job: owner ids of job runners, and how long a job's lease lasts.

A job runner (a ``tunehub serve`` replica, or ``tunehub tune``) claims a job with a lease:
the job row names its owner and when the lease expires. The owner renews the lease while it
runs the job; a lease that is not renewed expires and the job goes back to the queue, to be
taken by whoever claims next. Nothing checks whether a process is alive: leases alone decide,
on one host or many (see docs/leases.md). A replica given a stable id (TUNEHUB_REPLICA_ID)
takes back at start the jobs its earlier process held, without waiting for their leases.
"""

from __future__ import annotations

import os
import secrets
import socket

# How long a claim holds a job without a renewal (TUNEHUB_LEASE_SECS); holders renew every
# third of it, so two renewals may fail before the lease is lost.
DEFAULT_LEASE_SECS = 30.0


def new_owner(replica_id: str | None = None) -> str:
    """A fresh owner id, ``host:pid:random`` (``replica/host:pid:random`` for a named replica):
    unique to this call, so two job runners of one process, or a process restarted with the
    same pid, never share one.

    >>> a, b = new_owner(), new_owner()
    >>> a != b and a.split(":")[1] == str(os.getpid())
    True
    >>> owner_replica(new_owner("api-1")), owner_replica(a)
    ('api-1', None)
    """
    process = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    return f"{replica_id}/{process}" if replica_id else process


def owner_replica(owner: str) -> str | None:
    """The replica id an owner id was made with (``new_owner(replica_id)``), or None."""
    replica, sep, _ = owner.partition("/")
    return replica if sep and replica else None
