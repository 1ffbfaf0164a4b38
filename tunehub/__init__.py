"""tunehub: an ML-driven autotuning service for compute kernels."""

from __future__ import annotations

__version__ = "0.1.0"
