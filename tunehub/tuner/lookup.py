"""Tiered schedule lookup: exact target, then the same target family."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunehub.core import Schedule, Target, Workload
from tunehub.db.store import ScheduleStore


@dataclass(frozen=True)
class LookupAnswer:
    """A schedule and the tier it came from (``exact`` or ``family``)."""

    schedule: Schedule
    source: str

    def to_dict(self) -> dict[str, Any]:
        """The answer as the API and the CLI print it."""
        s = self.schedule
        return {
            "config": s.config.to_dict(),
            "template": s.template,
            "template_version": s.template_version,
            "median_secs": s.median_secs,
            "gflops": s.gflops,
            "source": self.source,
            "record_id": s.record_uid,
            "target_key": s.target_key,
            "workload_key": s.workload_key,
            "updated_at": s.updated_at.isoformat(),
        }


def find_schedule(
    store: ScheduleStore, workload: Workload, target: Target, *, template: str | None = None
) -> LookupAnswer | None:
    """The best known schedule for ``workload`` on ``target``, or None if nothing is known.

    Tiers, in order: a schedule tuned on exactly this target; one tuned for the same workload on
    another target of the same family (same CPU model and ISA, other toolchain versions).
    """
    exact = store.get_schedule(
        workload_key=workload.key, target_key=target.target_key, template=template
    )
    if exact is not None:
        return LookupAnswer(exact, "exact")
    family = store.family_schedules(
        workload_key=workload.key, family_key=target.family_key, template=template
    )
    if family:
        return LookupAnswer(family[0], "family")
    return None
