"""Routes of the models resource (the cost-model registry) and a job's predictions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status

from tunehub.core import MeasureStatus, ModelInfo
from tunehub.db.store import JobNotFound
from tunehub.kernels.registry import UnknownTemplate, get_template
from tunehub.service.auth import KeyedRoute, ReadAccess
from tunehub.service.deps import ModelsDep, StoreDep
from tunehub.service.schemas import (
    NAME_PATTERN,
    ModelListOut,
    ModelOut,
    PredictionListOut,
    PredictionOut,
)

router = APIRouter(
    prefix="/api/v1", tags=["models"], route_class=KeyedRoute, dependencies=[ReadAccess]
)

JobId = Annotated[int, Path(ge=1, le=2**31 - 1, description="Job id.")]


@router.get(
    "/models",
    response_model=ModelListOut,
    operation_id="list_models",
    summary="Registered cost models: the ones in use and the refused candidates",
)
def list_models(
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    template: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=64,
            pattern=NAME_PATTERN,
            description="Only models of this template (default: any).",
        ),
    ] = None,
) -> ModelListOut:
    """Every registered global model, newest first, with its held-out metrics, the analytical
    default's on the same workloads and the quality gate's verdict; `active` lists the model
    in use of each family, template and template version (the newest accepted one)."""
    found = store.list_models(template=template, limit=limit)
    active: dict[tuple[str, str, int], ModelInfo] = {}
    for key in dict.fromkeys((m.family_key, m.template, m.template_version) for m in found):
        info = store.latest_model(
            family_key=key[0], template=key[1], template_version=key[2], accepted_only=True
        )
        if info is not None:
            active[key] = info
    in_use = {m.id for m in active.values()}
    return ModelListOut(
        active=[ModelOut.from_core(m, active=True) for m in active.values()],
        items=[ModelOut.from_core(m, active=m.id in in_use) for m in found],
    )


@router.get(
    "/jobs/{job_id}/predictions",
    response_model=PredictionListOut,
    operation_id="job_predictions",
    summary="The global model's predicted time against the measured time of a job's records",
    responses={404: {"description": "No such job."}},
)
def job_predictions(job_id: JobId, store: StoreDep, models: ModelsDep) -> PredictionListOut:
    """For each ok record of the job, the model in use for its target family and template
    (the newest the quality gate accepted) predicts the config's time; `model` is null when
    there is none."""
    try:
        job = store.get_job(job_id)
        records = store.job_records(job_id)
    except JobNotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job with id {job_id}") from None
    target = store.get_target(job.spec.target_key)
    try:
        template = get_template(job.spec.template)
    except UnknownTemplate:
        template = None
    if target is None or template is None:
        return PredictionListOut(model=None, items=[], spearman=None)
    found = models.latest_model(target, template.name, template.version)
    if found is None:
        return PredictionListOut(model=None, items=[], spearman=None)
    info, model = found
    trials = [r for r in records if r.verdict]
    position = {r.uid: i + 1 for i, r in enumerate(trials)}
    ok = [r for r in trials if r.status is MeasureStatus.OK and r.median_secs is not None]
    secs = model.predict_secs(job.spec.workload, target, [r.config for r in ok]) if ok else []
    items = [
        PredictionOut(
            uid=r.uid,
            trial=position[r.uid],
            measured_secs=r.median_secs or 0.0,
            predicted_secs=p,
        )
        for r, p in zip(ok, secs or [], strict=False)
    ]
    rho = None
    if len(items) >= 3:
        from scipy.stats import spearmanr

        value = float(
            spearmanr([i.measured_secs for i in items], [i.predicted_secs for i in items]).statistic
        )
        rho = value if value == value else None  # NaN when either side is constant
    return PredictionListOut(model=ModelOut.from_core(info, active=True), items=items, spearman=rho)
