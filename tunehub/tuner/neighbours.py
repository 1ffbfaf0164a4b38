"""The nearest tuned workloads of an untuned one, and their schedules' configs: what a
``predicted`` answer is checked against.

``NeighbourIndex`` keeps the tuned set of each (target key, template, template version) as
compact arrays (log2 m, n, k; small integer codes for op, epilogue and (dtype, a_layout,
b_layout); the workload keys, ascending; an index into a table of the distinct configs), built
from the store once, and searches it vectorised: ``workload_distance`` for every row at once,
then the ``CHECK_NEIGHBOURS`` smallest. About 105 bytes a row (10^6 schedules: 105 MB),
where Schedule and Workload objects would take well over a gigabyte.

Same answers as reading every schedule and sorting on ``workload_distance``: the distances are
the same floats (log2 by ``math.log2``, summed in the same order), and ties go to the smaller
workload key, which is the stores' order of ``target_schedules`` (by workload key) kept by a
stable sort.

Freshness: the index is thread-safe and may be kept for the process's life; ``forget`` is told
the workloads whose schedules may have changed (the service calls it from the lookup cache's
reader of ``ScheduleStore.lookup_changes``), and the next search of a tuned set re-reads those
workloads' schedules only (or the whole set, after too many changes or when told "all").
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tunehub.core import Config, Target, Workload
from tunehub.db.store import ScheduleStore
from tunehub.kernels.base import Template

# Tuned shapes whose winners a prediction is checked against.
CHECK_NEIGHBOURS = 3
# Configs that won on a target offered to an untuned shape's pick (see ``pool``).
POOL = 24
# Changed workloads a tuned set is patched for; more, and it is read again whole.
MAX_PENDING = 5_000

SetKey = tuple[str, str, int]  # (target key, template, template version)
F64 = npt.NDArray[np.float64]
I32 = npt.NDArray[np.int32]


@dataclass(frozen=True)
class TunedSet:
    """The tuned workloads of one (target, template, version), one row each, by workload key
    (ascending). Never changed once made: a patch makes a new one."""

    keys: npt.NDArray[np.bytes_]
    log_m: F64
    log_n: F64
    log_k: F64
    op: I32
    epilogue: I32
    kind: I32  # (dtype, a_layout, b_layout)
    config: I32  # index into the index's configs

    def __len__(self) -> int:
        return len(self.keys)


class _Codes:
    """Small integer codes of names (append-only; -1 for a name never seen)."""

    def __init__(self) -> None:
        self._codes: dict[object, int] = {}

    def code(self, name: object) -> int:
        found = self._codes.get(name)
        if found is None:
            found = self._codes[name] = len(self._codes)
        return found

    def get(self, name: object) -> int:
        return self._codes.get(name, -1)


class NeighbourIndex:
    """The nearest tuned workloads' winners on a target, from cached arrays; see the module
    docstring. Thread-safe: one per process (the service's), or one per call."""

    def __init__(self, store: ScheduleStore) -> None:
        self.store = store
        self._sets: dict[SetKey, TunedSet] = {}
        # Workloads changed since each set was read (None: read it all again). Guarded by
        # _pending_lock only, so that the change feed's reader never waits on a build.
        self._pending: dict[SetKey, set[str] | None] = {}
        self._pending_lock = threading.Lock()
        self._build_lock = threading.Lock()  # one build or patch at a time
        self._ops = _Codes()
        self._epilogues = _Codes()
        self._kinds = _Codes()
        self._configs: list[Config] = []
        self._config_codes: dict[str, int] = {}
        self.builds = 0
        self.patches = 0
        self._pools: dict[SetKey, tuple[TunedSet, list[Config]]] = {}

    # --- freshness -------------------------------------------------------------------------
    def forget(self, workload_keys: Collection[str] | None) -> None:
        """Schedules of these workloads (None: of any) may have changed: the next search of
        each tuned set reads them again first."""
        with self._pending_lock:
            for key, pending in self._pending.items():
                if pending is None:
                    continue
                if workload_keys is None or len(pending) + len(workload_keys) > MAX_PENDING:
                    self._pending[key] = None
                else:
                    pending.update(workload_keys)

    # --- search ----------------------------------------------------------------------------
    def winners(self, workload: Workload, target: Target, template: Template) -> list[Config]:
        """Schedules of the nearest tuned workloads on this target (same template version),
        nearest first; the workload itself is not one of them."""
        tuned = self.tuned_set(target, template)
        rows = self.nearest_rows(tuned, workload)
        return [self._configs[int(tuned.config[row])] for row in rows]

    def pool(self, target: Target, template: Template, limit: int = POOL) -> list[Config]:
        """The configs that won most often among this target's tuned shapes (same template
        version), most frequent first: candidates for a shape nobody tuned. Kept per tuned
        set (a new set after a change counts again)."""
        tuned = self.tuned_set(target, template)
        key = (target.target_key, template.name, template.version)
        with self._pending_lock:
            found = self._pools.get(key)
        if found is not None and found[0] is tuned:
            return found[1][:limit]
        codes, counts = np.unique(tuned.config, return_counts=True)
        order = np.lexsort((codes, -counts))[:POOL]
        configs = [self._configs[int(codes[i])] for i in order]
        with self._pending_lock:
            self._pools[key] = (tuned, configs)
        return configs[:limit]

    def nearest_rows(self, tuned: TunedSet, workload: Workload) -> list[int]:
        """Rows of the ``CHECK_NEIGHBOURS`` nearest workloads of another key and the same op,
        by (distance, workload key)."""
        if len(tuned) == 0:
            return []
        dist = self._distances(tuned, workload)
        dist[tuned.op != self._ops.get(workload.op)] = np.inf
        row = int(np.searchsorted(tuned.keys, workload.key.encode()))
        if row < len(tuned) and tuned.keys[row] == workload.key.encode():
            dist[row] = np.inf
        finite = int(np.count_nonzero(np.isfinite(dist)))
        want = min(CHECK_NEIGHBOURS, finite)
        if want == 0:
            return []
        if finite > want:
            # Every row as near as the want-th nearest (ties at the cut included), then the
            # exact order among those few: distance, then row (= workload key).
            cut = np.partition(dist, want - 1)[want - 1]
            candidates = np.flatnonzero(dist <= cut)
        else:
            candidates = np.flatnonzero(np.isfinite(dist))
        order = np.lexsort((candidates, dist[candidates]))
        return [int(candidates[i]) for i in order[:want]]

    def _distances(self, tuned: TunedSet, workload: Workload) -> F64:
        """``workload_distance`` of every row to ``workload``: the same floats (log2 by
        math.log2, the three dimensions summed left to right, then the penalties)."""
        d = np.abs(tuned.log_m - math.log2(workload.m))
        d += np.abs(tuned.log_n - math.log2(workload.n))
        d += np.abs(tuned.log_k - math.log2(workload.k))
        d += np.where(tuned.epilogue != self._epilogues.get(workload.epilogue), 1.0, 0.0)
        d += np.where(tuned.kind != self._kinds.get(_kind(workload)), 4.0, 0.0)
        return d

    # --- the tuned sets --------------------------------------------------------------------
    def tuned_set(self, target: Target, template: Template) -> TunedSet:
        """The tuned set of (target, template, version), read or brought up to date first."""
        key = (target.target_key, template.name, template.version)
        with self._build_lock:
            with self._pending_lock:
                if key not in self._sets:
                    pending: set[str] | None = None
                else:
                    pending = self._pending.get(key, None)
                self._pending[key] = set()  # changes from here on are seen by the next search
            if pending is None:
                self._sets[key] = self._read(key, None)
                self.builds += 1
            elif pending:
                try:
                    self._sets[key] = self._patch(key, self._sets[key], pending)
                except BaseException:
                    with self._pending_lock:  # not applied: read the set again next time
                        self._pending[key] = None
                    raise
                self.patches += 1
            return self._sets[key]

    def _read(self, key: SetKey, workload_keys: Collection[str] | None) -> TunedSet:
        """The rows of these workloads' schedules (None: every one) in the set, by key."""
        target_key, template, version = key
        rows = self.store.tuned_shapes(
            target_key=target_key,
            template=template,
            template_version=version,
            workload_keys=workload_keys,
        )
        rows.sort(key=lambda r: r.workload_key)  # the stores give them so; kept whatever they do
        log2: dict[int, float] = {}

        def logs(values: Sequence[int]) -> F64:
            out = np.empty(len(values), dtype=np.float64)
            for i, v in enumerate(values):
                found = log2.get(v)
                if found is None:
                    found = log2[v] = math.log2(v)
                out[i] = found
            return out

        ops, epilogues, kinds = self._ops.code, self._epilogues.code, self._kinds.code
        return TunedSet(
            keys=np.array([r.workload_key.encode() for r in rows], dtype=np.bytes_),
            log_m=logs([r.m for r in rows]),
            log_n=logs([r.n for r in rows]),
            log_k=logs([r.k for r in rows]),
            op=np.array([ops(r.op) for r in rows], dtype=np.int32),
            epilogue=np.array([epilogues(r.epilogue) for r in rows], dtype=np.int32),
            kind=np.array([kinds((r.dtype, r.a_layout, r.b_layout)) for r in rows], dtype=np.int32),
            config=np.array([self._config_code(r.config) for r in rows], dtype=np.int32),
        )

    def _patch(self, key: SetKey, tuned: TunedSet, changed: set[str]) -> TunedSet:
        """``tuned`` with the rows of ``changed`` workloads read again (kept, replaced, gone
        or new), still by key."""
        fresh = self._read(key, changed)
        asked = np.array(sorted(k.encode() for k in changed), dtype=np.bytes_)
        at = np.searchsorted(tuned.keys, asked)
        inside = at < len(tuned)
        at = at[inside]
        drop = at[tuned.keys[at] == asked[inside]]
        keep = np.ones(len(tuned), dtype=bool)
        keep[drop] = False
        kept_keys = tuned.keys[keep]
        where = np.searchsorted(kept_keys, fresh.keys)  # fresh is by key: inserts stay sorted

        def merged(name: str) -> Any:
            old: npt.NDArray[Any] = getattr(tuned, name)[keep]
            new: npt.NDArray[Any] = getattr(fresh, name)
            if old.dtype.kind == "S" and new.dtype.kind == "S":
                width = max(old.dtype.itemsize, new.dtype.itemsize, 1)
                old, new = old.astype(f"S{width}"), new.astype(f"S{width}")
            return np.insert(old, where, new)

        return TunedSet(
            keys=merged("keys"),
            log_m=merged("log_m"),
            log_n=merged("log_n"),
            log_k=merged("log_k"),
            op=merged("op"),
            epilogue=merged("epilogue"),
            kind=merged("kind"),
            config=merged("config"),
        )

    def _config_code(self, text: str) -> int:
        """The config's row in the table of distinct configs, by its JSON text (two texts of
        one config get two rows of equal Configs: harmless)."""
        found = self._config_codes.get(text)
        if found is None:
            found = self._config_codes[text] = len(self._configs)
            self._configs.append(Config(json.loads(text)))
        return found


def _kind(workload: Workload) -> tuple[str, str, str]:
    return (workload.dtype, workload.a_layout, workload.b_layout)
