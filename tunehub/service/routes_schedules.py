"""Routes of the schedules resource: the compiler-facing lookup and the stored listing."""

from __future__ import annotations

from collections import Counter as Tally
from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response, status

from tunehub.core import LOCAL_CPU, InvalidSpec, Scope, Target, Workload
from tunehub.core.operators import ParamValue, get_operator
from tunehub.core.registry import UnknownName
from tunehub.core.workload import MAX_DIM
from tunehub.cost_model.registry import ModelCache
from tunehub.db.store import SCHEDULE_SORTS, ScheduleStore
from tunehub.service import metrics
from tunehub.service.auth import KeyedRoute, ReadAccess, authorize
from tunehub.service.batch_lookup import (
    CLIENT_CLOSED,
    cached_item,
    caller_left,
    encode,
    encode_schedule,
    item_key,
    miss,
    parse_items,
    schedule_data,
)
from tunehub.service.deps import (
    LocalTargetsDep,
    ModelsDep,
    SettingsDep,
    StoreDep,
    resolve_target,
    resolve_targets,
    unknown_target_reason,
)
from tunehub.service.lookup_cache import CachedAnswer, LookupCache, encoded_answer
from tunehub.service.schemas import (
    NAME_PATTERN,
    Dtype,
    Epilogue,
    Layout,
    LookupBatchOut,
    LookupRequest,
    ScheduleListOut,
    ScheduleOut,
)
from tunehub.service.settings import Settings
from tunehub.tuner.lookup import (
    LookupAnswer,
    LookupCancelled,
    LookupQuery,
    LookupTuningLimits,
    NeighbourIndex,
    TuningOutcome,
    UntunedAnswer,
    find_schedule,
    find_schedules,
    predict_schedule,
    predict_schedules,
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
    op: Annotated[
        QueryName, Query(description="Only workloads of this operator (`bmm`, `conv2d`, ...).")
    ] = None,
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
        op=op,
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
    m: QueryDim | None = None,
    n: QueryDim | None = None,
    k: QueryDim | None = None,
    op: Annotated[
        str,
        Query(
            min_length=1,
            max_length=32,
            pattern=NAME_PATTERN,
            description="Operator (`GET /api/v1/operators`); its own fields (`bmm`: `batch`, "
            "`b_broadcast`) are query parameters of their own names.",
        ),
    ] = "matmul",
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
    # The app's parts read here rather than as dependencies: FastAPI resolving four of them
    # was a few percent of an uncached lookup's CPU time.
    state = request.app.state
    store: ScheduleStore = state.store
    local: dict[str, Target] = getattr(state, "local_targets", {})
    models: ModelCache = state.models
    settings: Settings = state.settings
    # Taken before the database is read: an answer computed across a change is not cached.
    generation = state.lookup_cache.generation
    try:
        params = operator_params(op, request)
        if m is None or n is None or k is None:
            # Left out: the operator derives them (conv2d), or the Workload says which is
            # required.
            data: dict[str, object] = {**params, "op": op, "m": m, "n": n, "k": k}
            derived = Workload.from_dict(data)
            m, n, k = derived.m, derived.n, derived.k
        workload = Workload(
            params=tuple(params.items()),
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
    untuned = predict_schedule(
        store, workload, tgt, models, template=template, neighbours=neighbour_index(request)
    )
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


# The lookup's own query parameters; any other name is one of the operator's own fields.
_LOOKUP_QUERY = frozenset(
    ("m", "n", "k", "op", "dtype", "a_layout", "b_layout", "epilogue", "allow_tf32", "target",
     "template", "tune")
)  # fmt: skip


def operator_params(op: str, request: Request) -> dict[str, ParamValue]:
    """The operator's own fields from the query string (``batch=8``); InvalidSpec naming a
    name the operator does not have, or a value it refuses."""
    names = [name for name in request.query_params if name not in _LOOKUP_QUERY]
    if not names:
        return {}
    try:
        operator = get_operator(op)
    except UnknownName:
        return {}  # Workload names the unknown op
    return {name: operator.field(name).parse(request.query_params[name]) for name in names}


def neighbour_index(request: Request) -> NeighbourIndex:
    """The process's index of tuned sets, kept fresh from the change feed (app.py)."""
    index: NeighbourIndex = request.app.state.neighbours
    return index


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
) -> Response:
    """The answer of `GET /api/v1/schedules/best` for each item, in the order asked, or why
    not: `{"ok": false, "status": 422, "loc": [...]}` for a malformed item (the others are
    still answered), 404 where no template runs the workload on the target.

    The exact and family tiers of every item are read together (a bounded number of queries
    however many items); `predicted` and `default` answers are computed in the service.
    `tune: true` queues tuning for the untuned items, as `tune=true` does for one."""
    cache: LookupCache = request.app.state.lookup_cache
    # Taken before the database is read: an answer computed across a change is not cached.
    generation = cache.generation
    parsed, misses = parse_items(body.items)
    results: list[bytes | dict[str, Any] | None] = [None] * len(body.items)
    tiers = [""] * len(body.items)  # each answered item's tier, for the metrics
    for i, refusal in misses.items():
        results[i] = refusal
    targets = resolve_targets(store, {name for _, _, name, _ in parsed}, local=local)
    queries: list[tuple[int, LookupQuery]] = []
    for i, workload, name, template in parsed:
        tgt = targets.get(name)
        if tgt is None:
            results[i] = miss(422, unknown_target_reason(name, local), ("target",))
        else:
            queries.append((i, LookupQuery(workload, tgt, template)))
    queue, key_id, refused = tuning_decision(request, settings, body.tune)
    # Answers that say nothing of this request's tuning are the same for every caller: those
    # kept from earlier batches are used as they are, the others kept for the next.
    cacheable = not (queue or refused)
    if cacheable:
        keys = [item_key(q) for _, q in queries]
        unknown = []
        for (i, q), cached in zip(queries, cache.get_many(keys), strict=True):
            if cached is None:
                unknown.append((i, q))
            else:
                results[i], tiers[i] = cached.body, cached.source
        queries = unknown
    answers = find_schedules(store, [q for _, q in queries])
    # The untuned items together (their candidates scored in one call), abandoned if the
    # caller leaves meanwhile.
    asked = [(i, q) for (i, q), answer in zip(queries, answers, strict=True) if answer is None]
    try:
        guessed = predict_schedules(
            store,
            [q for _, q in asked],
            models,
            neighbours=neighbour_index(request),
            cancelled=partial(caller_left, request),
        )
    except LookupCancelled:
        return Response(status_code=CLIENT_CLOSED)
    guesses = {i: guess for (i, _), guess in zip(asked, guessed, strict=True)}
    untuned: list[tuple[int, UntunedAnswer]] = []
    tuning: dict[int, dict[str, Any]] = {}
    keep: list[tuple[bytes, CachedAnswer]] = []
    for (i, q), answer in zip(queries, answers, strict=True):
        found: LookupAnswer | UntunedAnswer | None = answer
        if found is None:
            found = guesses[i]
            if found is None:
                reason = f"no template runs {q.workload.label} on {q.target.label}"
                results[i] = miss(404, reason, ())
                continue
            untuned.append((i, found))
        tiers[i] = found.source
        schedule = schedule_data(found)
        if cacheable:
            encoded = encode_schedule(schedule)
            results[i] = encoded
            keep.append((item_key(q), cached_item(q, encoded, found.source)))
        else:
            results[i] = tuning[i] = schedule
            if answer is not None:
                outcome = TuningOutcome(False, None, f"tuned already ({answer.source})")
                schedule["tuning"] = outcome.to_dict()
    cache.put_many(keep, generation)
    if queue and untuned:
        outcomes = queue_lookup_tuning(
            store,
            [guess for _, guess in untuned],
            lookup_limits(settings),
            api_key_id=key_id,
            max_active_total=settings.max_queued_jobs,
        )
        for (i, _), outcome in zip(untuned, outcomes, strict=True):
            tuning[i]["tuning"], tuning[i]["tuning_job_id"] = outcome.to_dict(), outcome.job_id
    elif refused:
        for i, _ in untuned:
            tuning[i]["tuning"] = TuningOutcome(False, None, refused).to_dict()
    for i, schedule in tuning.items():
        results[i] = encode_schedule(schedule)
    counted: Tally[tuple[str, int]] = Tally()
    for tier, result in zip(tiers, results, strict=True):
        if isinstance(result, dict) and not tier:  # LookupMissOut
            counted[("", int(result["status"]))] += 1
        else:
            counted[(tier, 200)] += 1
    metrics.batch_items(counted)
    # Built in LookupBatchOut's shape and encoded once: FastAPI does not validate a Response
    # (the model above is the documented shape; the tests hold the answer to it).
    return Response(content=encode(results), media_type="application/json")
