"""Operators as a seam (issue 24): bmm's spec, its CPU template and baseline against the
reference, its features, the API's 422s, lookups and a job over real HTTP, and the migration
of a database holding matmul records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import text

from tests.live import LiveServer
from tests.test_api import add_key
from tests.test_migrations import _fill_0003, empty_url  # noqa: F401 (a fixture)
from tunehub.client import TunehubClient
from tunehub.client.schedules import workload_fields, workload_tuple
from tunehub.core import (
    Config,
    InvalidSpec,
    MeasureRequest,
    MeasureStatus,
    Workload,
    local_cpu_target,
)
from tunehub.cost_model.features import feature_set
from tunehub.db import MemoryScheduleStore, SqlScheduleStore, make_engine, upgrade
from tunehub.db.migrate import alembic_config
from tunehub.kernels.base import TimingPolicy
from tunehub.kernels.blis_bmm import BlisBmmTemplate
from tunehub.kernels.registry import get_template
from tunehub.service.app import create_app
from tunehub.service.settings import Settings
from tunehub.tuner.lookup import find_schedule, predict_schedule

BMM = {"op": "bmm", "batch": 3, "m": 37, "n": 45, "k": 29}


def bmm(**changes: Any) -> Workload:
    return Workload.from_dict({**BMM, **changes})


# --- the spec ----------------------------------------------------------------------------------
def test_a_bmm_workload_has_its_own_fields_key_and_counts() -> None:
    w = bmm()
    assert w.params == (("batch", 3), ("b_broadcast", False))
    assert w.label == "bmm 3x37x45x29 float32"
    assert w.flops == 2 * 3 * 37 * 45 * 29
    assert w.operand_bytes == 4 * (3 * 37 * 29 + 3 * 29 * 45 + 3 * 37 * 45)
    shared = bmm(b_broadcast=True)
    assert shared.operand_bytes == 4 * (3 * 37 * 29 + 29 * 45 + 3 * 37 * 45)
    assert shared.label.endswith("B:bcast float32")
    assert len({w.key, shared.key, bmm(batch=4).key, Workload(m=37, n=45, k=29).key}) == 4
    assert Workload.from_dict(w.to_dict()) == w
    # Given as pairs or a mapping, in any order: one workload, one key.
    assert Workload(op="bmm", m=37, n=45, k=29, params=(("b_broadcast", False), ("batch", 3))) == w
    # A matmul keeps the key the first format gave it.
    assert Workload(m=256, n=256, k=256).key == (
        "eb28581344c06c7dca7206815aeff1f567140b9b6bcba9756ddc1960b49eea11"
    )


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"batch": 0}, "batch", "must be >= 1"),
        ({"batch": "8"}, "batch", "must be an integer"),
        ({"batch": True}, "batch", "must be an integer"),
        ({"b_broadcast": 1}, "b_broadcast", "must be true or false"),
        ({"groups": 2}, "groups", "not a field of op bmm"),
        ({"epilogue": "bias"}, "epilogue", "op bmm fuses no bias epilogue"),
        ({"op": "conv9d"}, "op", "unknown op 'conv9d'"),
        ({"batch": 65536, "m": 4096, "n": 4096, "k": 4096}, "k", "exceeds"),
    ],
)
def test_a_bad_bmm_spec_names_the_field(changes: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        bmm(**changes)
    assert info.value.field == field and reason in info.value.reason


def test_a_matmul_has_no_batch() -> None:
    with pytest.raises(InvalidSpec, match="batch: not a field of op matmul"):
        Workload.from_dict({"m": 8, "n": 8, "k": 8, "batch": 2})


# --- the CPU template and its baseline ---------------------------------------------------------
def test_blis_bmm_matches_the_reference_on_odd_shapes_strided_and_broadcast(
    tmp_path: Path,
) -> None:
    target = local_cpu_target()
    template = BlisBmmTemplate()
    rng = np.random.default_rng(7)
    for shape in ({"batch": 5, "m": 13, "n": 19, "k": 7}, {"batch": 2, "m": 70, "n": 33, "k": 300}):
        for broadcast in (False, True):
            for dtype in ("float32", "float64"):
                w = bmm(**shape, b_broadcast=broadcast, dtype=dtype)
                seeds = template.seed_configs(w, target)
                assert {c["BPAR"] for c in seeds} == (
                    {"inner", "batch"} if target.cores > 1 else {"inner"}
                )
                for config in seeds[:4]:
                    kernel = template.compile(w, target, config, tmp_path)
                    batch, m, n, k = shape["batch"], shape["m"], shape["n"], shape["k"]
                    a = rng.uniform(-1, 1, (batch, m, k)).astype(dtype)
                    b = rng.uniform(-1, 1, (k, n) if broadcast else (batch, k, n)).astype(dtype)
                    c = np.full((batch, m, n), np.nan, dtype=dtype)
                    kernel.bmm(a, b, out=c)
                    ref = a.astype(np.float64) @ b.astype(np.float64)
                    tol = 1e-4 if dtype == "float32" else 1e-10
                    assert np.allclose(c, ref, atol=tol * k), (w.label, config)


def test_blis_bmm_and_torch_bmm_measure_checked_times(tmp_path: Path) -> None:
    target = local_cpu_target()
    w = bmm(b_broadcast=True)
    timing = TimingPolicy(min_secs=0.02, max_repeats=5)
    for name in ("blis.bmm", "torch.bmm"):
        template = get_template(name)
        config = template.default_config(w, target)
        request = MeasureRequest(w, target, name, template.version, config)
        result = template.measure(request, build_dir=tmp_path, timing=timing)
        assert result.status is MeasureStatus.OK, result.error
        assert result.median_secs is not None and result.median_secs > 0
        assert result.environment["verify_rows"] == 3 * 37
    assert get_template("blis.bmm").baseline_template == "torch.bmm"


def test_a_wrong_bmm_is_a_wrong_answer(tmp_path: Path) -> None:
    """A kernel that skips the last batch entry leaves NaN there: the check names the entry."""
    target = local_cpu_target()
    template = BlisBmmTemplate()
    w = bmm()
    kernel = template.compile(w, target, template.default_config(w, target), tmp_path)
    from tunehub.kernels.blis_bmm import bmm_operands, check_bmm

    rng = np.random.default_rng(1)
    a, b = bmm_operands(w, rng)
    c = np.full((3, 37, 45), np.nan, dtype=np.float32)
    kernel.bmm(a[:2], b[:2], out=c[:2])
    ok, _, _, _, message = check_bmm(c, a, b, rng)
    assert not ok and message.startswith("batch entry 2:")


def test_bmm_features_see_the_batch_and_its_split() -> None:
    target = local_cpu_target()
    w = bmm(batch=3)
    points = BlisBmmTemplate().space(w, target).points
    features = feature_set("blis.bmm")
    x = features.matrix(w, target, points)
    assert x.shape == (len(points), len(features.names))
    column = x[:, features.names.index("log2_batch")]
    assert np.allclose(column, np.log2(3))
    split = x[:, features.names.index("bpar_batch")]
    assert {float(v) for v in split} == ({0.0, 1.0} if target.cores > 1 else {0.0})


# --- the API ---------------------------------------------------------------------------------
@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    store = MemoryScheduleStore()
    app = create_app(Settings(home=tmp_path, run_jobs=False), store=store)
    with TestClient(app, base_url="http://127.0.0.1") as c:
        c.headers["X-API-Key"] = add_key(store)
        yield c


@pytest.mark.parametrize(
    ("workload", "loc"),
    [
        ({**BMM, "batch": 0}, ["body", "workload", "batch"]),
        ({**BMM, "batch": "many"}, ["body", "workload", "batch"]),
        ({**BMM, "batches": 2}, ["body", "workload", "batches"]),
        ({**BMM, "epilogue": "bias_relu"}, ["body", "workload", "epilogue"]),
        ({**BMM, "op": "conv9d"}, ["body", "workload", "op"]),
        ({**BMM, "dtype": "float16"}, ["body", "workload", "dtype"]),  # no CPU bmm kernel
    ],
)
def test_a_bad_bmm_job_is_a_422_naming_the_field(
    client: TestClient, workload: dict[str, Any], loc: list[str]
) -> None:
    response = client.post("/api/v1/jobs", json={"workload": workload})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == loc, response.text


def test_a_bmm_job_takes_the_bmm_template_and_lookups_answer_it(client: TestClient) -> None:
    job = client.post("/api/v1/jobs", json={"workload": BMM, "budget": {"max_trials": 2}})
    assert job.status_code == 202, job.text
    assert job.json()["template"] == "blis.bmm"
    assert job.json()["workload"] == bmm().to_dict()
    # A matmul job still takes blis.gemm; blis.gemm refuses a bmm, naming the op.
    matmul = client.post("/api/v1/jobs", json={"workload": {"m": 8, "n": 8, "k": 8}})
    assert matmul.json()["template"] == "blis.gemm"
    refused = client.post("/api/v1/jobs", json={"workload": BMM, "template": "blis.gemm"})
    assert refused.json()["detail"][0]["loc"] == ["body", "workload", "op"]

    answer = client.get("/api/v1/schedules/best", params={**BMM, "b_broadcast": "true"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["template"] == "blis.bmm" and answer.json()["source"] == "default"
    assert answer.json()["workload_key"] == bmm(b_broadcast=True).key
    bad = client.get("/api/v1/schedules/best", params={**BMM, "batch": "x"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "batch"]
    unknown = client.get("/api/v1/schedules/best", params={"m": 8, "n": 8, "k": 8, "batch": 2})
    assert unknown.status_code == 422 and "not a field of op matmul" in unknown.text

    batch = client.post(
        "/api/v1/schedules/lookup",
        json={"items": [{"workload": BMM}, {"workload": {**BMM, "batch": -1}}]},
    ).json()["results"]
    assert batch[0]["ok"] and batch[0]["schedule"]["template"] == "blis.bmm"
    assert not batch[1]["ok"] and batch[1]["loc"] == ["workload", "batch"]

    operators = client.get("/api/v1/operators").json()
    by_name = {o["name"]: o for o in operators["items"]}
    assert [f["name"] for f in by_name["bmm"]["fields"]] == ["batch", "b_broadcast"]
    assert by_name["matmul"]["fields"] == []


def test_the_client_keys_and_sends_an_operators_fields() -> None:
    key = workload_tuple(BMM)
    assert key[-1] == (("batch", 3),)
    common = {"dtype": "float32", "a_layout": "row_major", "b_layout": "row_major"}
    assert workload_fields(key) == {
        **BMM, **common, "epilogue": "none", "allow_tf32": False
    }  # fmt: skip
    assert Workload.from_dict(workload_fields(key)) == bmm()
    assert workload_tuple(bmm())[-1] == (("b_broadcast", False), ("batch", 3))
    assert workload_tuple({"m": 37, "n": 45, "k": 29})[-1] == ()


@pytest.mark.slow
def test_a_bmm_job_over_http_becomes_the_schedule_its_lookup_returns(tmp_path: Path) -> None:
    shape = {"op": "bmm", "batch": 4, "m": 48, "n": 40, "k": 33, "b_broadcast": True}
    with LiveServer(tmp_path) as server, TunehubClient(server.url, api_key=server.key) as client:
        job = client.submit_job(shape, max_trials=2, max_secs=240)
        assert job["template"] == "blis.bmm"
        done = client.wait(job["id"], timeout_secs=300)
        assert done["state"] == "succeeded", (done, server.logs())
        ok = [r for r in client.job_records(job["id"]) if r["status"] == "ok"]
        assert ok
        answer = client.best_schedule(shape)
        assert answer is not None and answer["source"] == "exact"
        assert answer["template"] == "blis.bmm" and "BPAR" in answer["config"]
        baseline = answer["baseline"]
        assert baseline is None or baseline["template"] == "torch.bmm"


# --- the migration ---------------------------------------------------------------------------
def test_upgrade_keeps_matmul_records_schedules_and_lookups(empty_url: str) -> None:  # noqa: F811
    upgrade(empty_url, revision="0003")
    engine = make_engine(empty_url)
    keys = _fill_0003(engine)
    upgrade(engine, revision="0011")
    upgrade(engine)
    store = SqlScheduleStore(engine)
    workload = Workload(m=64, n=48, k=32, epilogue="bias")
    assert store.get_workload(keys["workload"]) == workload
    target = store.get_target(keys["target"])
    assert target is not None
    answer = find_schedule(store, workload, target)
    assert answer is not None and answer.source == "exact"
    assert answer.schedule.config == Config({"MR": 6, "NR": 64})
    # A bmm workload and its schedule live beside them.
    w = bmm()
    record = _bmm_record(w, target)
    store.commit_records([record])
    assert store.get_workload(w.key) == w
    found = find_schedule(store, w, target)
    assert found is not None and found.schedule.template == "blis.bmm"
    assert predict_schedule(store, bmm(batch=9), target, None) is not None
    # Back to 0011 only once no other operator is stored.
    with pytest.raises(RuntimeError, match="other than matmul"):
        command.downgrade(alembic_config(empty_url), "0011")
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM schedules WHERE workload_key = :w"), {"w": w.key})
        conn.execute(text("DELETE FROM records WHERE workload_key = :w"), {"w": w.key})
        conn.execute(text("DELETE FROM workloads WHERE workload_key = :w"), {"w": w.key})
    command.downgrade(alembic_config(empty_url), "0011")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT m FROM workloads")).scalar_one() == 64
    engine.dispose()


def _bmm_record(workload: Workload, target: Any) -> Any:
    from tunehub.core import MeasureRecord, MeasureResult

    template = BlisBmmTemplate()
    config = template.default_config(workload, target)
    request = MeasureRequest(workload, target, template.name, template.version, config)
    return MeasureRecord(
        request=request, result=MeasureResult(MeasureStatus.OK, repeat_secs=(1e-4,))
    )


# --- the CLI ---------------------------------------------------------------------------------
def test_the_cli_names_a_bad_operator_field_by_its_option(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tunehub.cli import main

    env = {"TUNEHUB_HOME": str(tmp_path)}
    runner = CliRunner()
    zero = runner.invoke(
        main, ["tune", "--op", "bmm", "--field", "batch=0", "8", "8", "8"], env=env
    )
    assert zero.exit_code == 2 and "Invalid value for --field batch: must be >= 1" in zero.output
    other = runner.invoke(main, ["lookup", "--field", "batch=2", "8", "8", "8"], env=env)
    assert other.exit_code == 2 and "not a field of op matmul" in other.output
    shape = runner.invoke(main, ["tune", "--op", "bmm", "--field", "batch", "8", "8", "8"], env=env)
    assert shape.exit_code == 2 and "expected NAME=VALUE" in shape.output
