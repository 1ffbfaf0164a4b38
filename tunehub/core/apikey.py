"""API keys: scopes, the key's stored form (a public prefix and a hash), making and checking.

A key reads ``th_<prefix>_<secret>``. Only the prefix (8 hex digits, shown in listings) and the
sha256 of the whole key are stored, so a database dump cannot be turned back into keys; the
key itself is shown once, when it is made.

>>> token, prefix, digest = new_api_key()
>>> parse_api_key(token) == prefix and matches(token, digest)
True
>>> parse_api_key("th_nothex!_x") is None
True
>>> Scope.ADMIN.allows(Scope.WRITE), Scope.READ.allows(Scope.WRITE)
(True, False)
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime

from tunehub.core.errors import InvalidSpec

KEY_PREFIX = "th_"
KEY_NAME_LENGTH = 64
_PREFIX_HEX = 8
_TOKEN = re.compile(rf"^{KEY_PREFIX}([0-9a-f]{{{_PREFIX_HEX}}})_([A-Za-z0-9_-]{{43}})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._@:+-]*$")


class Scope(enum.StrEnum):
    """What a key may do; each scope includes the ones before it.

    ``read``: the API's GET routes when reads are closed; ``write``: submit jobs and cancel its
    own (and, later, upload records); ``admin``: everything, including cancelling any job and
    registering workers.
    """

    READ = "read"
    WRITE = "write"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return _RANKS[self]

    def allows(self, needed: Scope) -> bool:
        return self.rank >= needed.rank


_RANKS = {Scope.READ: 0, Scope.WRITE: 1, Scope.ADMIN: 2}


@dataclass(frozen=True)
class KeyLimits:
    """Per-key limits; None means the service's setting applies."""

    max_trials: int | None = None
    max_secs: float | None = None
    max_queued_jobs: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_trials", "max_queued_jobs"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise InvalidSpec(name, "must be a whole number >= 1")
        secs = self.max_secs
        if secs is not None and (
            isinstance(secs, bool) or not isinstance(secs, (int, float)) or not 0 < secs < 1e9
        ):
            raise InvalidSpec("max_secs", "must be a number of seconds > 0")


NO_LIMITS = KeyLimits()


@dataclass(frozen=True)
class ApiKey:
    """A stored key: who it is for, what it may do, its limits; never the key itself."""

    id: int
    prefix: str
    name: str
    scope: Scope
    created_at: datetime
    secret_hash: str = field(repr=False, default="")
    revoked_at: datetime | None = None
    limits: KeyLimits = NO_LIMITS

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    @property
    def label(self) -> str:
        """``name (th_1a2b3c4d)``, for messages: never the secret."""
        return f"{self.name} ({KEY_PREFIX}{self.prefix})" if self.name else KEY_PREFIX + self.prefix


def check_key_name(name: str) -> str:
    """A key's name: printable, 1..64 characters (letters, digits, space and ``._@:+-``)."""
    if not isinstance(name, str) or not 0 < len(name) <= KEY_NAME_LENGTH or not _NAME.match(name):
        raise InvalidSpec(
            "name",
            f"1..{KEY_NAME_LENGTH} characters: letters, digits, spaces and ._@:+- "
            "(starting with a letter or digit)",
        )
    return name


def hash_key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_api_key() -> tuple[str, str, str]:
    """A fresh key: (the key, its public prefix, its hash)."""
    prefix = secrets.token_hex(_PREFIX_HEX // 2)
    token = f"{KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    return token, prefix, hash_key(token)


def parse_api_key(token: str) -> str | None:
    """The prefix of a well-formed key, or None."""
    found = _TOKEN.match(token.strip()) if isinstance(token, str) else None
    return found.group(1) if found else None


def matches(token: str, secret_hash: str) -> bool:
    """Whether ``token`` is the key stored as ``secret_hash`` (in constant time)."""
    return hmac.compare_digest(hash_key(token.strip()), secret_hash)
