"""Shared pytest fixtures; each part keeps its own in tests/<part>_fixtures.py."""

from __future__ import annotations

from tests.db_fixtures import *  # noqa: F403
