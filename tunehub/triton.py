"""``tunehub.triton``: the Triton drop-ins (``matmul``, ``autotune``), kept in
``tunehub.client.triton`` with the other compiler integrations."""

from __future__ import annotations

from tunehub.client.triton import Autotuner, autotune, matmul

__all__ = ["Autotuner", "autotune", "matmul"]
