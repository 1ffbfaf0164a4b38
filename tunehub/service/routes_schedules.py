"""Routes of the schedules resource: the compiler-facing lookup."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status

from tunehub.core import LOCAL_CPU, InvalidSpec, Workload
from tunehub.core.workload import MAX_DIM
from tunehub.service.auth import KeyedRoute, ReadAccess
from tunehub.service.deps import (
    LocalTargetsDep,
    ModelsDep,
    SettingsDep,
    StoreDep,
    resolve_target,
)
from tunehub.service.schemas import NAME_PATTERN, Dtype, Epilogue, Layout, Op, ScheduleOut
from tunehub.tuner.lookup import find_schedule, predict_schedule, queue_tuning

router = APIRouter(
    prefix="/api/v1/schedules",
    tags=["schedules"],
    route_class=KeyedRoute,
    dependencies=[ReadAccess],
)

QueryDim = Annotated[int, Query(ge=1, le=MAX_DIM)]


@router.get(
    "/best",
    response_model=ScheduleOut,
    operation_id="best_schedule",
    summary="Best known schedule for a workload",
    responses={404: {"description": "No template runs this workload on this target."}},
)
def best_schedule(
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
            "background; the answer does not wait). The service setting `tune_unseen` does "
            "this for every lookup."
        ),
    ] = False,
) -> dict[str, Any]:
    """Answers in tiers: a schedule tuned on this `exact` target, then on the same target
    `family`, then the global cost model's `predicted` pick for a workload nobody tuned, then
    the template's analytical `default` (no model yet). The answer says which (`source`).

    Never tunes in the request: predictions come from a cached model trained in the
    background; `tune=true` only queues a job.
    """
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
    if answer is not None:
        # A dict, validated once against `response_model` (a model instance would be
        # validated here, dumped and validated again: a lookup is on every compiler's path).
        return answer.to_dict()
    untuned = predict_schedule(store, workload, tgt, models, template=template)
    if untuned is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            detail=f"no template runs {workload.label} on {tgt.label}",
        )
    if tune or settings.tune_unseen:
        untuned = queue_tuning(store, untuned)
    return untuned.to_dict()
