"""Routes of the schedules resource: the compiler-facing lookup and the stored listing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from pydantic import ValidationError

from tunehub.core import LOCAL_CPU, InvalidSpec, Scope, Workload
from tunehub.core.workload import MAX_DIM
from tunehub.db.store import SCHEDULE_SORTS
from tunehub.service.auth import KeyedRoute, ReadAccess, authorize
from tunehub.service.deps import (
    LocalTargetsDep,
    ModelsDep,
    SettingsDep,
    StoreDep,
    resolve_target,
    resolve_targets,
    unknown_target_reason,
)
from tunehub.service.lookup_cache import encoded_answer
from tunehub.service.redact import printable
from tunehub.service.schemas import (
    NAME_PATTERN,
    Dtype,
    Epilogue,
    Layout,
    LookupBatchOut,
    LookupItem,
    LookupRequest,
    Op,
    ScheduleListOut,
    ScheduleOut,
)
from tunehub.service.settings import Settings
from tunehub.tuner.lookup import (
    LookupQuery,
    LookupTuningLimits,
    NeighbourIndex,
    TuningOutcome,
    UntunedAnswer,
    find_schedule,
    find_schedules,
    predict_schedule,
    queue_lookup_tuning,
)

router = APIRouter(
    prefix="/api/v1/schedules",
    tags=["schedules"],
    route_class=KeyedRoute,
    dependencies=[ReadAccess],
)

QueryDim = Annotated[int, Query(ge=1, le=MAX_DIM)]
QueryName = Annotated[str | None, Query(min_length=1, max_length=64, pattern=NAME_PATTERN)]
ScheduleSort = Literal[SCHEDULE_SORTS]  # type: ignore[valid-type]
MAX_PAGE = 500


@router.get(
    "",
    response_model=ScheduleListOut,
    operation_id="list_schedules",
    summary="List stored schedules, a page at a time",
)
def list_schedules(
    store: StoreDep,
    target: Annotated[QueryName, Query(description="Only this target key.")] = None,
    template: Annotated[QueryName, Query(description="Only this template.")] = None,
    dtype: Annotated[Dtype | None, Query(description="Only workloads of this dtype.")] = None,
    sort: Annotated[
        ScheduleSort,
        Query(description="Column to sort on; schedules with no value for it come last."),
    ] = "updated_at",
    order: Annotated[Literal["asc", "desc"], Query(description="Sort direction.")] = "desc",
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> dict[str, Any]:
    """Every stored schedule — what compilers get for a workload on the target it was tuned
    on — with its speedup over the fastest vendor-library time measured beside it, a page at
    a time (the database cuts the page; `total` counts all matches)."""
    found, total = store.list_schedules(
        target_key=target,
        template=template,
        dtype=dtype,
        sort=sort,
        descending=order == "desc",
        limit=limit,
        offset=offset,
    )
    labels = {t.target_key: t.label for t in store.list_targets()} if found else {}
    items = []
    for item in found:
        s, workload = item.schedule, item.workload
        items.append(
            {
                "workload_key": s.workload_key,
                "workload": workload.to_dict(),
                "workload_label": workload.label,
                "target_key": s.target_key,
                "target_label": labels.get(s.target_key, s.target_key[:12]),
                "template": s.template,
                "template_version": s.template_version,
                "config": s.config.to_dict(),
                "median_secs": item.best_secs,
                "gflops": workload.gflops(item.best_secs),
                "baseline_secs": item.baseline_secs,
                "speedup_vs_baseline": item.speedup,
                "source": "exact",
                "updated_at": s.updated_at,
                "confirmed_at": s.confirmation.confirmed_at if s.confirmation else None,
            }
        )
    return {"items": items, "total": total, "limit": limit, "offset": offset}


@router.get(
    "/best",
    response_model=ScheduleOut,
    operation_id="best_schedule",
    summary="Best known schedule for a workload",
    responses={404: {"description": "No template runs this workload on this target."}},
)
def best_schedule(
    request: Request,
    store: StoreDep,
    local: LocalTargetsDep,
    models: ModelsDep,
    settings: SettingsDep,
    m: QueryDim,
    n: QueryDim,
    k: QueryDim,
    op: Op = "matmul",
    dtype: Dtype = "float32",
    a_layout: Layout = "row_major",
    b_layout: Layout = "row_major",
    epilogue: Epilogue = "none",
    allow_tf32: bool = False,
    target: Annotated[
        str,
        Query(
            min_length=1,
            max_length=64,
            pattern=NAME_PATTERN,
            description="`local-cpu`, `local-cuda:N` or a target key.",
        ),
    ] = LOCAL_CPU,
    template: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=64,
            pattern=NAME_PATTERN,
            description="Only schedules of this template (default: any).",
        ),
    ] = None,
    tune: Annotated[
        bool,
        Query(
            description="For an untuned workload, also queue a tuning job for it (in the "
            "background; the answer does not wait). Needs a key that may write (without one "
            "the answer's `tuning` says why nothing was queued); one job per workload and "
            "target, within the service's lookup-job limits, behind people's jobs. The "
            "service setting `tune_unseen` does this for every lookup."
        ),
    ] = False,
) -> Response:
    """Answers in tiers: a schedule tuned on this `exact` target, then on the same target
    `family`, then the global cost model's `predicted` pick for a workload nobody tuned, then
    the template's analytical `default` (no model yet). The answer says which (`source`).

    Never tunes in the request: predictions come from a cached model trained in the
    background; `tune=true` only queues a job.

    The answer carries an `ETag`; `If-None-Match` with it answers 304. Answers are cached in
    each serving process and forgotten when a schedule changes (see
    `TUNEHUB_LOOKUP_REFRESH_SECS`).
    """
    # Taken before the database is read: an answer computed across a change is not cached.
    generation = request.app.state.lookup_cache.generation
    try:
        workload = Workload(
            op=op,
            m=m,
            n=n,
            k=k,
            dtype=dtype,
            a_layout=a_layout,
            b_layout=b_layout,
            epilogue=epilogue,
            allow_tf32=allow_tf32,
        )
    except InvalidSpec as exc:
        raise InvalidSpec(exc.field, exc.reason) from None
    tgt = resolve_target(store, target, local=local)
    answer = find_schedule(store, workload, tgt, template=template)
    queue, key_id, refused = tuning_decision(request, settings, tune)
    if answer is not None:
        # A dict, encoded once (a lookup is on every compiler's path); an answer that says
        # something about this request's tuning is not cached.
        found = answer.to_dict()
        if queue or refused:
            tuned = TuningOutcome(False, None, f"tuned already ({answer.source})")
            found["tuning"] = tuned.to_dict()
        return encoded_answer(request, found, generation, cacheable=not (queue or refused))
    untuned = predict_schedule(store, workload, tgt, models, template=template)
    if untuned is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            detail=f"no template runs {workload.label} on {tgt.label}",
        )
    out = untuned.to_dict()
    if queue:
        (outcome,) = queue_lookup_tuning(
            store,
            [untuned],
            lookup_limits(settings),
            api_key_id=key_id,
            max_active_total=settings.max_queued_jobs,
        )
        out["tuning"], out["tuning_job_id"] = outcome.to_dict(), outcome.job_id
    elif refused:
        out["tuning"] = TuningOutcome(False, None, refused).to_dict()
    return encoded_answer(request, out, generation, cacheable=not (queue or refused))


def lookup_limits(settings: Settings) -> LookupTuningLimits:
    return LookupTuningLimits(
        max_jobs=settings.max_lookup_jobs,
        max_trials=settings.lookup_job_trials,
        max_secs=settings.lookup_job_secs,
    )


def tuning_decision(
    request: Request, settings: Settings, asked: bool
) -> tuple[bool, int | None, str | None]:
    """Whether a lookup's untuned answers queue tuning: (queue, the key to record, why not).

    Asking (``tune``) needs a key that may write; the service's own ``tune_unseen`` policy
    queues without one. Neither: (False, None, None), and the answer's ``tuning`` is null."""
    if asked:
        try:
            key = authorize(request, Scope.WRITE, "queueing tuning from a lookup")
        except HTTPException as exc:
            if settings.tune_unseen:
                return True, None, None
            return False, None, f"not queued: {exc.detail}"
        return True, None if key is None else key.id, None
    return settings.tune_unseen, None, None


@router.post(
    "/lookup",
    response_model=LookupBatchOut,
    operation_id="lookup_schedules",
    summary="Best known schedules for up to 1,000 workloads at once",
)
def lookup_schedules(
    body: LookupRequest,
    request: Request,
    store: StoreDep,
    local: LocalTargetsDep,
    models: ModelsDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """The answer of `GET /api/v1/schedules/best` for each item, in the order asked, or why
    not: `{"ok": false, "status": 422, "loc": [...]}` for a malformed item (the others are
    still answered), 404 where no template runs the workload on the target.

    The exact and family tiers of every item are read together (a bounded number of queries
    however many items); `predicted` and `default` answers are computed in the service.
    `tune: true` queues tuning for the untuned items, as `tune=true` does for one."""
    results: list[dict[str, Any] | None] = [None] * len(body.items)
    parsed: list[tuple[int, Workload, str, str | None]] = []
    for i, raw in enumerate(body.items):
        try:
            item = LookupItem.model_validate(raw)
            workload = item.workload.to_core()
        except ValidationError as exc:
            error = exc.errors(include_url=False, include_input=False)[0]
            results[i] = _miss(422, error["msg"], error["loc"])
            continue
        except InvalidSpec as exc:  # rules that span fields, e.g. the m*n*k limit
            results[i] = _miss(422, exc.reason, ("workload", *exc.field.split(".")))
            continue
        parsed.append((i, workload, item.target, item.template))
    targets = resolve_targets(store, {name for _, _, name, _ in parsed}, local=local)
    queries: list[tuple[int, LookupQuery]] = []
    for i, workload, name, template in parsed:
        tgt = targets.get(name)
        if tgt is None:
            results[i] = _miss(422, unknown_target_reason(name, local), ("target",))
        else:
            queries.append((i, LookupQuery(workload, tgt, template)))
    answers = find_schedules(store, [q for _, q in queries])
    queue, key_id, refused = tuning_decision(request, settings, body.tune)
    neighbours = NeighbourIndex(store)
    untuned: list[tuple[int, UntunedAnswer]] = []
    for (i, q), answer in zip(queries, answers, strict=True):
        if answer is not None:
            found = answer.to_dict()
            if queue or refused:
                found["tuning"] = TuningOutcome(
                    False, None, f"tuned already ({answer.source})"
                ).to_dict()
            results[i] = {"ok": True, "schedule": found}
            continue
        guess = predict_schedule(
            store, q.workload, q.target, models, template=q.template, neighbours=neighbours
        )
        if guess is None:
            reason = f"no template runs {q.workload.label} on {q.target.label}"
            results[i] = _miss(404, reason, ())
            continue
        results[i] = {"ok": True, "schedule": guess.to_dict()}
        untuned.append((i, guess))
    if queue and untuned:
        outcomes = queue_lookup_tuning(
            store,
            [guess for _, guess in untuned],
            lookup_limits(settings),
            api_key_id=key_id,
            max_active_total=settings.max_queued_jobs,
        )
        for (i, _), outcome in zip(untuned, outcomes, strict=True):
            schedule = results[i]["schedule"]  # type: ignore[index]
            schedule["tuning"], schedule["tuning_job_id"] = outcome.to_dict(), outcome.job_id
    elif refused:
        for i, _ in untuned:
            results[i]["schedule"]["tuning"] = TuningOutcome(False, None, refused).to_dict()  # type: ignore[index]
    return {"results": results}


def _miss(status_code: int, error: str, loc: Sequence[Any]) -> dict[str, Any]:
    # A location may hold a key the client sent: made printable (a NUL or a lone surrogate
    # cannot break the answer).
    where = [printable(p) if isinstance(p, str) else p for p in loc]
    return {"ok": False, "status": status_code, "error": printable(error), "loc": where}
