"""ModelInfo: a registered cost model (one version of the global model of a target family)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class ModelInfo:
    """A trained global model of ``template`` (at ``template_version``) for one target family.

    ``version`` counts up from 1 per (family, template, template version); the store assigns
    it (and ``id``) when the model is registered. ``last_record_seq`` is the newest record
    the training read, so a trainer knows how many records arrived since. ``metrics`` are
    held-out figures (e.g. ``spearman``, ``top1_fraction``). The artifact (the model's bytes)
    is stored beside the row and read apart, by id.

    ``accepted`` is the quality gate's verdict (see ``tunehub.cost_model.registry.gate``):
    only an accepted model ranks candidates in jobs and answers ``predicted`` lookups (the
    newest accepted one of its family, template and template version: the *active* model);
    a refused one is kept as a candidate, with ``reason`` saying why. None: registered before
    the gate existed (never used; the trainer retrains and gates it).
    """

    family_key: str
    template: str
    template_version: int
    kind: str  # e.g. "xgboost"
    features: str  # the feature set's key, e.g. "blis.gemm/1"
    records_used: int
    workloads_used: int
    last_record_seq: int
    created_at: datetime
    metrics: dict[str, float] = field(default_factory=dict)
    target_label: str = ""  # a readable name of the family (kind, model, arch)
    accepted: bool | None = None
    reason: str = ""  # the gate's figures behind its verdict, one line
    id: int = 0
    version: int = 0

    @property
    def label(self) -> str:
        """E.g. ``blis.gemm@2 3f2a9c1b v4``: what lookups and jobs name the model by."""
        return f"{self.template}@{self.template_version} {self.family_key[:8]} v{self.version}"
