"""The attention operator (issue 24): its spec and 422s, the ``triton.attention`` kernel and
template under Triton's interpreter on small shapes (causal and not, uneven lengths) against
the float32 reference and PyTorch's own attention, the ``torch.sdpa`` baseline, the features,
and lookups through the in-process API. GPU timings are measured on the GPU, not here."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
triton = pytest.importorskip("triton", reason="triton is not installed (the gpu extra)")

from fastapi.testclient import TestClient  # noqa: E402

from tests.test_api import add_key  # noqa: E402
from tests.test_triton_kernels import interpreter_bf16_dot  # noqa: E402, F401 (autouse)
from tunehub.core import (  # noqa: E402
    Config,
    InvalidSpec,
    MeasureRequest,
    MeasureStatus,
    Target,
    Workload,
)
from tunehub.cost_model.features import feature_set  # noqa: E402
from tunehub.db import MemoryScheduleStore  # noqa: E402
from tunehub.kernels import triton_attention_kernels as ak  # noqa: E402
from tunehub.kernels.base import TimingPolicy  # noqa: E402
from tunehub.kernels.registry import get_template  # noqa: E402
from tunehub.service.app import create_app  # noqa: E402
from tunehub.service.settings import Settings  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

H100 = Target(
    kind="cuda",
    name="H100",
    arch=("sm_90",),
    cores=132,
    vendor="nvidia",
    properties={"compute_capability": 90, "smem_per_block_bytes": 232448, "regs_per_sm": 65536},
)
ATTN = {"op": "attention", "m": 40, "n": 24, "k": 64, "dtype": "float16", "batch": 2, "heads": 3}


def attention(**changes: Any) -> Workload:
    return Workload.from_dict({**ATTN, **changes})


# --- the spec ----------------------------------------------------------------------------------
def test_an_attention_workload_has_its_fields_counts_and_key() -> None:
    w = attention()
    assert w.params == (("batch", 2), ("heads", 3), ("causal", False))
    assert w.label == "attention b2 h3 q40 kv24 d64 float16"
    assert w.flops == 4 * 2 * 3 * 40 * 24 * 64
    assert attention(causal=True).flops == w.flops // 2
    assert attention(causal=True).label == "attention b2 h3 q40 kv24 d64 causal float16"
    # Q and O: 40 x 64, K and V: 24 x 64, per (batch, head), 2 bytes each.
    assert w.operand_bytes == 6 * 2 * 64 * (2 * 40 + 2 * 24)
    keys = {w.key, attention(causal=True).key, attention(heads=4).key, attention(n=25).key}
    assert len(keys) == 4
    assert Workload.from_dict(w.to_dict()) == w


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"k": 96}, "k", "head_dim (k) of op attention must be 64 or 128, got 96"),
        ({"dtype": "float32"}, "dtype", "takes float16 or bfloat16"),
        ({"heads": 0}, "heads", "must be >= 1"),
        ({"batch": "2"}, "batch", "must be an integer"),
        ({"causal": 1}, "causal", "must be true or false"),
        ({"head_dim": 64}, "head_dim", "op attention takes head_dim as k"),
        ({"q_len": 40}, "q_len", "takes q_len as m"),
        ({"epilogue": "bias"}, "epilogue", "fuses no bias"),
        ({"b_layout": "col_major"}, "b_layout", "contiguous"),
    ],
)
def test_a_bad_attention_spec_names_the_field(
    changes: dict[str, Any], field: str, reason: str
) -> None:
    with pytest.raises(InvalidSpec) as raised:
        attention(**changes)
    assert raised.value.field == field and reason in str(raised.value)


# --- the kernel under the interpreter ------------------------------------------------------------
@pytest.mark.parametrize(
    ("q_len", "kv_len", "causal", "block_m", "block_n", "dtype"),
    [
        (40, 24, True, 16, 16, "float16"),  # more queries than keys; rows past kv_len
        (16, 48, False, 16, 32, "float16"),  # kv_len a multiple of BLOCK_N (no key mask)
        (37, 45, True, 32, 32, "float16"),  # both uneven, partial last tiles
        (24, 40, False, 32, 16, "bfloat16"),
        (33, 24, True, 16, 16, "bfloat16"),
    ],
)
def test_the_kernel_matches_the_reference_and_pytorch(
    q_len: int, kv_len: int, causal: bool, block_m: int, block_n: int, dtype: str
) -> None:
    w = attention(m=q_len, n=kv_len, causal=causal, dtype=dtype, batch=2, heads=2)
    ops = ak.operands(w, torch.device("cpu"), seed=q_len * kv_len)
    config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": 4, "num_stages": 2}
    ak.bind(ops.q, ops.k, ops.v, ops.out, causal=causal, config=config)()
    ref = ak.reference(ops)
    check = ak.check(ops.out, ref, dtype)
    assert check.ok, check.message
    assert check.relative_error > 0  # rounded to the dtype: not the reference copied
    # The reference is PyTorch's own attention in float32 (its top-left causal mask).
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        ops.q.float(), ops.k.float(), ops.v.float(), is_causal=causal
    )
    assert torch.allclose(ref, sdpa, atol=1e-5)


@pytest.mark.parametrize(
    ("q_len", "kv_len", "causal", "block_m", "block_n", "loads"),
    [
        (40, 24, True, 16, 16, "tma"),  # rows past kv_len, boxes past both ends zero-filled
        (37, 45, True, 16, 32, "tma"),  # BLOCK_N > BLOCK_M: one block spans two diagonals
        (48, 64, False, 32, 16, "tma"),  # no masked loop at all (even kv_len, not causal)
        (37, 45, True, 32, 16, "ws"),  # the warp-specialised single loop, every block masked
        (33, 40, False, 16, 16, "ws"),  # ... with a partial last key block
        (64, 64, True, 16, 32, "ptr"),  # diagonal blocks only masked, full blocks not
    ],
)
def test_the_tma_and_warp_specialised_loops_match_the_reference(
    q_len: int, kv_len: int, causal: bool, block_m: int, block_n: int, loads: str
) -> None:
    w = attention(m=q_len, n=kv_len, causal=causal, batch=1, heads=2)
    ops = ak.operands(w, torch.device("cpu"), seed=q_len + kv_len)
    config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": 4, "num_stages": 2,
              "TMA": loads != "ptr", "WARP_SPECIALIZE": loads == "ws"}  # fmt: skip
    ak.bind(ops.q, ops.k, ops.v, ops.out, causal=causal, config=config)()
    check = ak.check(ops.out, ak.reference(ops), "float16")
    assert check.ok, check.message


def test_bind_refuses_what_the_kernel_cannot_take() -> None:
    w = attention(m=16, n=16, batch=1, heads=1)
    ops = ak.operands(w, torch.device("cpu"), seed=3)
    base = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}
    with pytest.raises(ValueError, match="WARP_SPECIALIZE needs TMA"):
        ak.bind(
            ops.q, ops.k, ops.v, ops.out, causal=False, config={**base, "WARP_SPECIALIZE": True}
        )
    with pytest.raises(ValueError, match="lacks"):
        ak.bind(ops.q, ops.k, ops.v, ops.out, causal=False, config={"BLOCK_M": 16})
    # Rows 65 elements apart (130 bytes) are no 16-byte multiple: TMA cannot step them.
    wide = torch.zeros((1, 1, 16, 65), dtype=torch.float16)[..., :64]
    with pytest.raises(ValueError, match="16-byte"):
        ak.bind(wide, ops.k, ops.v, ops.out, causal=False, config={**base, "TMA": True})
    ak.bind(wide, ops.k, ops.v, ops.out, causal=False, config=base)()  # pointer loads can
    assert torch.isfinite(ops.out).all()


def test_the_check_fails_unwritten_rows_and_a_wrong_mask() -> None:
    w = attention(m=24, n=24, causal=True, batch=1, heads=1)
    ops = ak.operands(w, torch.device("cpu"), seed=7)
    ref = ak.reference(ops)
    unwritten = ak.check(ops.out, ref, "float16")  # O is still NaN
    assert not unwritten.ok and "not finite" in unwritten.message
    config = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    ak.bind(ops.q, ops.k, ops.v, ops.out, causal=False, config=config)()  # mask left off
    unmasked = ak.check(ops.out, ref, "float16")
    assert not unmasked.ok and "relative error" in unmasked.message


def test_a_kernel_writing_nan_is_one_stored_wrong_answer_not_a_failed_job() -> None:
    # The H200 suite of 2026-11-26 lost its attention jobs at 6-8 trials: a candidate's
    # non-finite output put an infinite relative error into the record's environment, which
    # the store (strict JSON) refused, failing the whole job.
    from tunehub.core import MeasureRecord
    from tunehub.db.common import check_records
    from tunehub.kernels.gpu_timing import check_then_time

    w = attention(m=24, n=24, batch=1, heads=1)
    ops = ak.operands(w, torch.device("cpu"), seed=3)
    ref = ak.reference(ops)
    result = check_then_time(
        lambda: ops.out.fill_(math.nan),
        lambda _: ak.check(ops.out, ref, "float16"),
        device=torch.device("cpu"),
        environment={},
        timing=TimingPolicy(min_secs=0.01, max_repeats=1),
    )
    assert result.status is MeasureStatus.WRONG_ANSWER and "not finite" in result.error
    assert result.environment["relative_error"] is None
    config = Config({"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1})
    record = MeasureRecord(request("triton.attention", w, config), result)
    assert check_records([record]) == [record]


# --- the template and the baseline ---------------------------------------------------------------
def request(template: str, workload: Workload, config: Config) -> MeasureRequest:
    tmpl = get_template(template)
    return MeasureRequest(
        workload=workload, target=H100, template=template, template_version=tmpl.version,
        config=config,
    )  # fmt: skip


def test_the_space_fits_the_sequence_and_the_device() -> None:
    tmpl = get_template("triton.attention")
    small = attention()
    space = tmpl.space(small, H100)
    assert {int(c["BLOCK_M"]) for c in space.points} == {16, 32, 64}  # q_len 40
    assert {int(c["BLOCK_N"]) for c in space.points} == {16, 32}  # kv_len 24
    assert space.is_valid(tmpl.default_config(small, H100))
    long = attention(m=8192, n=8192, k=128, heads=32, causal=True)
    configs = tmpl.space(long, H100).points
    assert {int(c["num_stages"]) for c in configs} == {1, 2, 3, 4, 5}
    off = {"TMA": False, "WARP_SPECIALIZE": False, "GLUON": False}
    too_big = Config({"BLOCK_M": 256, "BLOCK_N": 128, "num_warps": 2, "num_stages": 1, **off})
    assert "registers" in (tmpl.invalid_reason(long, H100, too_big) or "")
    deep = Config({"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 5, **off})
    assert "shared memory" in (tmpl.invalid_reason(long, H100, deep) or "")
    assert all(c in configs for c in tmpl.seed_configs(long, H100))


def test_hopper_adds_tma_warp_specialisation_and_gluon_to_the_space_and_seeds() -> None:
    tmpl = get_template("triton.attention")
    long = attention(m=4096, n=4096, k=128, heads=32, causal=True)
    ampere = {"compute_capability": 80, "smem_per_block_bytes": 166912}
    a100 = Target(kind="cuda", name="A100", arch=("sm_80",), cores=108, properties=ampere)
    full_long = attention(m=4096, n=4096, k=128, heads=32)
    hopper = tmpl.space(full_long, H100).points
    assert {(c["TMA"], c["WARP_SPECIALIZE"], c["GLUON"]) for c in hopper} == {
        (False, False, False), (True, False, False), (True, True, False), (True, False, True)
    }  # fmt: skip
    # Triton 3.6 specialises only a TMA-fed loop of 4 warps (the rest compile the plain loop),
    # and on the H200 its kernels were right only at 2 stages.
    assert {(c["num_warps"], c["num_stages"]) for c in hopper if c["WARP_SPECIALIZE"]} == {(4, 2)}
    # The Gluon kernel: 16 query rows a warp.
    assert {(c["BLOCK_M"], c["num_warps"]) for c in hopper if c["GLUON"]} == {(64, 4), (128, 8)}
    causal = tmpl.space(long, H100).points
    assert {(c["TMA"], c["WARP_SPECIALIZE"], c["GLUON"]) for c in causal} == {
        (False, False, False), (True, False, False), (True, True, False), (True, False, True)
    }  # fmt: skip
    assert {
        (c["TMA"], c["WARP_SPECIALIZE"], c["GLUON"]) for c in tmpl.space(long, a100).points
    } == {(False, False, False)}
    # Hopper starts at the Gluon kernel's 64 x 64 tiles with 2 stages, causal or not.
    for workload in (long, full_long):
        default = tmpl.default_config(workload, H100)
        assert default["GLUON"] and default["TMA"] and not default["WARP_SPECIALIZE"]
        assert (default["BLOCK_M"], default["BLOCK_N"], default["num_stages"]) == (64, 64, 2)
    # Lengths that are no multiples of its tiles too (partial last tiles masked); a decode's
    # 16 queries start at the plain kernels' 16-row tiles.
    ragged = attention(m=4000, n=4000, k=128, heads=32, causal=True)
    assert tmpl.default_config(ragged, H100)["GLUON"]
    decode = tmpl.default_config(attention(m=16, n=8192, k=128, heads=32), H100)
    assert not decode["GLUON"] and decode["BLOCK_M"] == 16
    assert not tmpl.default_config(long, a100)["TMA"]
    seeds = tmpl.seed_configs(full_long, H100)
    assert any(c["WARP_SPECIALIZE"] for c in seeds) and all(c in hopper for c in seeds)
    causal_seeds = tmpl.seed_configs(long, H100)  # right when causal, but slower: not seeded
    assert not any(c["WARP_SPECIALIZE"] for c in causal_seeds)
    assert all(c in causal for c in causal_seeds)
    ws8 = Config({"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2,
                  "TMA": True, "WARP_SPECIALIZE": True, "GLUON": False})  # fmt: skip
    assert "num_warps=4" in (tmpl.invalid_reason(full_long, H100, ws8) or "")
    ws4 = Config({**ws8.to_dict(), "num_warps": 4})
    assert tmpl.invalid_reason(full_long, H100, ws4) is None
    assert tmpl.invalid_reason(long, H100, ws4) is None
    ws3 = Config({**ws4.to_dict(), "num_stages": 3})
    assert "wrong outputs" in (tmpl.invalid_reason(full_long, H100, ws3) or "")
    tma = Config({**ws4.to_dict(), "WARP_SPECIALIZE": False})
    assert "sm_90" in (tmpl.invalid_reason(long, a100, tma) or "")
    assert "missing" in (tmpl.invalid_reason(long, H100, Config({"BLOCK_M": 64})) or "")
    # The Gluon kernel's own limits, each named.
    glu = Config({**tma.to_dict(), "BLOCK_M": 64, "BLOCK_N": 64, "GLUON": True})
    assert tmpl.invalid_reason(long, H100, glu) is None
    assert "sm_90" in (tmpl.invalid_reason(long, a100, glu) or "")
    assert "TMA on" in (
        tmpl.invalid_reason(long, H100, Config({**glu.to_dict(), "TMA": False})) or ""
    )
    assert "16 query rows a warp" in (
        tmpl.invalid_reason(long, H100, Config({**glu.to_dict(), "BLOCK_M": 128})) or ""
    )
    assert tmpl.invalid_reason(ragged, H100, glu) is None


def test_the_gluon_kernel_is_refused_where_it_cannot_run() -> None:
    # Triton's interpreter has no Gluon; the kernel takes any lengths, contiguous tensors.
    w = attention(m=64, n=64, batch=1, heads=1)
    ops = ak.operands(w, torch.device("cpu"), seed=5)
    config = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "TMA": True,
              "GLUON": True}  # fmt: skip
    with pytest.raises(ValueError, match="Hopper GPU only"):
        ak.bind(ops.q, ops.k, ops.v, ops.out, causal=True, config=config)
    assert "GLUON needs TMA" in (ak.config_problem({**config, "TMA": False}) or "")
    assert "GLUON needs TMA" in (ak.config_problem({**config, "WARP_SPECIALIZE": True}) or "")
    gk = pytest.importorskip("tunehub.kernels.triton_attention_gluon")
    assert gk.problem(config) is None
    assert "16 query rows" in (gk.problem({**config, "num_warps": 8}) or "")
    assert "contiguous" in (gk.problem(config, contiguous=False) or "")


def test_triton_attention_and_sdpa_measure_checked_times(tmp_path: Path) -> None:
    w = attention(m=33, n=40, causal=True)
    timing = TimingPolicy(min_secs=0.01, max_repeats=2)
    tmpl = get_template("triton.attention")
    config = Config({"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2,
                     "TMA": True, "WARP_SPECIALIZE": False, "GLUON": False})  # fmt: skip
    result = tmpl.measure(request("triton.attention", w, config), build_dir=tmp_path, timing=timing)
    assert result.status is MeasureStatus.OK, result.error
    assert result.repeat_secs and result.environment["relative_error"] < 3e-3
    assert tmpl.baseline_config(config, w, H100) == Config({"backend": "auto"})

    sdpa = get_template("torch.sdpa")
    assert [c["backend"] for c in sdpa.baseline_configs(w, H100)] == [
        "auto", "flash", "efficient", "cudnn"
    ]  # fmt: skip
    auto = sdpa.measure(
        request("torch.sdpa", w, Config({"backend": "auto"})), build_dir=tmp_path, timing=timing
    )
    assert auto.status is MeasureStatus.OK, auto.error
    assert auto.environment["sdpa_backend"] in ("flash", "efficient", "cudnn", "math", "unknown")
    # cuDNN's attention has no CPU kernel: refused with PyTorch's reason, not timed.
    cudnn = sdpa.measure(
        request("torch.sdpa", w, Config({"backend": "cudnn"})), build_dir=tmp_path, timing=timing
    )
    assert cudnn.status is MeasureStatus.INVALID and "cannot run" in (cudnn.error or "")


def test_attention_features_read_the_operator_and_the_tiles() -> None:
    fs = feature_set("triton.attention")
    w = attention(m=1024, n=1024, heads=8, batch=4)
    configs = [
        Config({"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}),
        Config({"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "TMA": True,
                "GLUON": True}),
    ]  # fmt: skip
    x = fs.matrix(w, H100, configs)
    col = {name: x[:, i] for i, name in enumerate(fs.names)}
    assert col["log2_programs"].tolist() == [math.log2(8 * 32), math.log2(16 * 32)]
    # Which kernel: configs stored before a knob existed read as off.
    assert col["gluon"].tolist() == [0, 1] and col["tma"].tolist() == [0, 1]
    assert col["warp_specialize"].tolist() == [0, 0]
    assert col["log2_heads_batch"][0] == 5 and col["causal"][0] == 0
    causal = fs.matrix(attention(m=1024, n=1024, heads=8, batch=4, causal=True), H100, configs)
    kb = fs.names.index("log2_key_blocks")
    assert causal[0, kb] < x[0, kb]  # a causal tile walks fewer key blocks


# --- the API -----------------------------------------------------------------------------------
@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, MemoryScheduleStore]]:
    store = MemoryScheduleStore()
    store.put_target(H100)
    app = create_app(Settings(home=tmp_path, run_jobs=False), store=store)
    with TestClient(app, base_url="http://127.0.0.1") as c:
        c.headers["X-API-Key"] = add_key(store)
        yield c, store


@pytest.mark.parametrize(
    ("changes", "loc"),
    [
        ({"k": 96}, ["body", "workload", "k"]),
        ({"heads": 0}, ["body", "workload", "heads"]),
        ({"causal": "yes"}, ["body", "workload", "causal"]),
        ({"dtype": "float32"}, ["body", "workload", "dtype"]),
        ({"head_dim": 64}, ["body", "workload", "head_dim"]),
    ],
)
def test_a_bad_attention_job_is_a_422_naming_the_field(
    client: tuple[TestClient, MemoryScheduleStore], changes: dict[str, Any], loc: list[str]
) -> None:
    http, _ = client
    body = {"workload": {**ATTN, **changes}, "target": H100.target_key}
    response = http.post("/api/v1/jobs", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == loc, response.text


def test_an_attention_lookup_answers_through_the_api(
    client: tuple[TestClient, MemoryScheduleStore],
) -> None:
    http, _ = client
    query = {**ATTN, "causal": "true", "target": H100.target_key}
    answer = http.get("/api/v1/schedules/best", params=query)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["template"] == "triton.attention" and body["source"] == "default"
    assert body["workload_key"] == attention(causal=True).key
    default = get_template("triton.attention").default_config(attention(causal=True), H100)
    assert body["config"] == default.to_dict()
    bad = http.get("/api/v1/schedules/best", params={**query, "k": 80})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "k"]
    # On the CPU no template computes attention.
    cpu = http.get("/api/v1/schedules/best", params={**ATTN})
    assert cpu.status_code == 404, cpu.text

    batch = http.post(
        "/api/v1/schedules/lookup",
        json={
            "items": [
                {"workload": ATTN, "target": H100.target_key},
                {"workload": {**ATTN, "heads": -1}, "target": H100.target_key},
            ]
        },
    ).json()["results"]
    assert batch[0]["ok"] and batch[0]["schedule"]["template"] == "triton.attention"
    assert not batch[1]["ok"] and batch[1]["loc"] == ["workload", "heads"]

    operators = {o["name"]: o for o in http.get("/api/v1/operators").json()["items"]}
    spec = operators["attention"]
    assert [f["name"] for f in spec["fields"]] == ["batch", "heads", "causal"]
    assert {t["name"] for t in spec["templates"]} == {"triton.attention", "torch.sdpa"}
    assert spec["epilogues"] == ["none"]
