"""What every measurement records about where and when it ran."""

from __future__ import annotations

import os
import socket
from typing import Any

from tunehub.core import utc_now
from tunehub.core.target import local_cpu_target


def measurement_environment() -> dict[str, Any]:
    """Host, CPU, pid and time of a measurement (JSON-friendly)."""
    host = local_cpu_target()
    return {
        "host": socket.gethostname(),
        "cpu": host.name,
        "cpu_arch": list(host.arch),
        "cores": host.cores,
        "pid": os.getpid(),
        "measured_at": utc_now().isoformat(),
    }
