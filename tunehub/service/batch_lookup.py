"""The batch lookup's payload work: its items validated in one pass, its answers built as
plain data in the API's field order and encoded once each (no per-item or response
validation), and kept encoded in the lookup cache for the next batch that asks.

A batch of 1,000 items is on a compiler's path; validating each item as a model, then the
whole answer against ``LookupBatchOut`` (1,000 nested models, timestamps parsed back from
text) and encoding it again cost more than reading the schedules. Here the items go through
one ``list[LookupItem]`` validator (the malformed ones, if any, then one by one for their own
error), and the answer is built from the tuner's answers with their timestamps as datetimes,
so pydantic's encoder writes exactly what ``ScheduleOut`` would (tests hold it to that).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio.from_thread
import pydantic_core
from fastapi import Request
from pydantic import TypeAdapter, ValidationError

from tunehub.core import InvalidSpec, Workload
from tunehub.service.lookup_cache import UNTUNED, CachedAnswer
from tunehub.service.redact import printable
from tunehub.service.schemas import LookupItem, ScheduleOut
from tunehub.tuner.lookup import LookupAnswer, LookupQuery, UntunedAnswer

_ITEMS: TypeAdapter[list[LookupItem]] = TypeAdapter(list[LookupItem])
# The status logged for a batch whose caller left before its answer (nginx's convention).
CLIENT_CLOSED = 499
# ScheduleOut's fields in its order; those an answer leaves out are null (their default).
_SCHEDULE_FIELDS = tuple(ScheduleOut.model_fields)


def caller_left(request: Request) -> bool:
    """Whether the client of ``request`` has gone (asked from the route's worker thread; a
    call from outside the event loop's threads answers False)."""
    try:
        return bool(anyio.from_thread.run(request.is_disconnected))
    except RuntimeError:  # not a worker thread of the event loop
        return False


def parse_items(
    raw: Sequence[Any],
) -> tuple[list[tuple[int, Workload, str, str | None]], dict[int, dict[str, Any]]]:
    """The well-formed items as (index, workload, target name, template), and a miss (422,
    see ``miss``) for each malformed one by index, with the error a lone item would get."""
    misses: dict[int, dict[str, Any]] = {}
    try:
        items = list(enumerate(_ITEMS.validate_python(raw)))
    except ValidationError as exc:
        bad = {e["loc"][0] for e in exc.errors(include_url=False, include_input=False)}
        for i in sorted(b for b in bad if isinstance(b, int)):
            misses[i] = _invalid(raw[i])
        good = [i for i in range(len(raw)) if i not in misses]
        items = list(zip(good, _ITEMS.validate_python([raw[i] for i in good]), strict=True))
    parsed = []
    for i, item in items:
        try:
            workload = item.workload.to_core()
        except InvalidSpec as exc:  # rules that span fields, e.g. the m*n*k limit
            misses[i] = miss(422, exc.reason, ("workload", *exc.field.split(".")))
            continue
        parsed.append((i, workload, item.target, item.template))
    return parsed, misses


def _invalid(raw: Any) -> dict[str, Any]:
    """The 422 of one item the list validator refused: its first error, located in the item."""
    try:
        LookupItem.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        return miss(422, error["msg"], error["loc"])
    raise AssertionError(f"an item refused in a list was accepted alone: {raw!r}")


def miss(status_code: int, error: str, loc: Sequence[Any]) -> dict[str, Any]:
    """An item not answered (``LookupMissOut``). A location may hold a key the client sent:
    made printable (a NUL or a lone surrogate cannot break the answer)."""
    where = [printable(p) if isinstance(p, str) else p for p in loc]
    return {"ok": False, "status": status_code, "error": printable(error), "loc": where}


def schedule_data(answer: LookupAnswer | UntunedAnswer) -> dict[str, Any]:
    """An answer as ``ScheduleOut`` holds it: its fields in order, timestamps as datetimes
    for the encoder."""
    data = answer.to_dict(iso_times=False) if isinstance(answer, LookupAnswer) else answer.to_dict()
    schedule: dict[str, Any] = dict.fromkeys(_SCHEDULE_FIELDS)
    schedule.update(data)
    return schedule


def encode_schedule(schedule: dict[str, Any]) -> bytes:
    """``schedule_data``'s dict as ``ScheduleOut.model_dump_json`` writes it."""
    return pydantic_core.to_json(schedule)


def item_key(query: LookupQuery) -> bytes:
    """An item's key in the lookup cache: behind a NUL byte, which no query string (the
    single lookups' keys) holds."""
    text = f"{query.workload.key}\0{query.target.target_key}\0{query.template or ''}"
    return b"\0lookup\0" + text.encode()


def cached_item(query: LookupQuery, body: bytes, source: str) -> CachedAnswer:
    """An item's encoded answer as the lookup cache keeps it (forgotten with its workload;
    untuned ones whenever any schedule or model changes). Never served as a single answer,
    so it has no ETag."""
    return CachedAnswer(
        body=body,
        etag=b"",
        workload_key=query.workload.key,
        untuned=source in UNTUNED,
        source=source,
    )


def encode(results: Sequence[bytes | dict[str, Any] | None]) -> bytes:
    """The ``LookupBatchOut`` body: each result an encoded schedule (an item answered) or a
    miss (every result filled in), written as pydantic's encoder writes the whole."""
    parts = []
    for result in results:
        if isinstance(result, bytes):
            parts.append(b'{"ok":true,"schedule":' + result + b"}")
        else:
            parts.append(pydantic_core.to_json(result))
    return b'{"results":[' + b",".join(parts) + b"]}"
