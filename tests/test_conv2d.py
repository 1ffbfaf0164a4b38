"""conv2d (issue 24): its spec (derived GEMM view, counts, a field-naming refusal), blis.conv2d
against the float64 reference on odd shapes, padding, strides, dilation, groups and depthwise
in both layouts, threaded, its measurement and torch's beside it, features, and a job, a lookup
and the CLI through the real paths."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.test_api import add_key
from tunehub.core import (
    InvalidSpec,
    MeasureRequest,
    MeasureStatus,
    Workload,
    local_cpu_target,
)
from tunehub.cost_model.features import feature_set
from tunehub.db import MemoryScheduleStore
from tunehub.kernels.base import TimingPolicy
from tunehub.kernels.blis_conv import BlisConv2dTemplate
from tunehub.kernels.conv2d_reference import check_conv, conv_operands, conv_output
from tunehub.kernels.registry import get_template
from tunehub.service.app import create_app
from tunehub.service.settings import Settings

RESNET = {"op": "conv2d", "in_channels": 64, "out_channels": 128, "height": 56, "width": 56,
          "kernel_h": 3, "kernel_w": 3, "stride_h": 2, "stride_w": 2, "pad_h": 1,
          "pad_w": 1}  # fmt: skip
SMALL = {"op": "conv2d", "in_channels": 5, "out_channels": 7, "height": 9, "width": 11,
         "kernel_h": 3, "kernel_w": 3}  # fmt: skip


def conv(base: dict[str, Any] = SMALL, **changes: Any) -> Workload:
    return Workload.from_dict({**base, **changes})


# --- the spec --------------------------------------------------------------------------------
def test_a_conv2d_workload_derives_its_gemm_view_and_counts() -> None:
    w = conv(RESNET, batch=2, data_layout="nhwc")
    assert (w.m, w.n, w.k) == (28 * 28, 128, 64 * 9)
    assert w.flops == 2 * 28 * 28 * 128 * 576 * 2
    assert w.operand_bytes == 4 * (2 * 64 * 56 * 56 + 128 * 576 + 2 * 128 * 28 * 28)
    assert w.label == "conv2d 2x64x56x56 -> 128 k3x3 s2 p1 nhwc float32"
    assert Workload.from_dict(w.to_dict()) == w and w.key != conv(RESNET, batch=2).key
    depthwise = conv(SMALL, in_channels=8, out_channels=8, groups=8, dilation_h=2, pad_h=2)
    assert (depthwise.n, depthwise.k, depthwise.operator.multiplicity(depthwise)) == (1, 9, 8)
    with pytest.raises(InvalidSpec, match=r"^m: op conv2d derives m = 784"):
        Workload(op="conv2d", m=100, n=128, k=576, params=tuple(RESNET.items())[1:])


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"groups": 2}, "groups", "must divide in_channels (5) and out_channels (7), got 2"),
        ({"kernel_h": 12}, "kernel_h", "spans 12 rows/columns, more than the padded height 9"),
        ({"in_channels": None}, "in_channels", "is required"),
        ({"data_layout": "hwcn"}, "data_layout", "must be one of nchw, nhwc"),
        ({"pad_w": -1}, "pad_w", "must be >= 0"),
        ({"dtype": "float8_e4m3"}, "dtype", "op conv2d takes"),
        ({"b_layout": "col_major"}, "b_layout", "data_layout"),
    ],
)
def test_a_bad_conv2d_spec_names_the_field(
    changes: dict[str, Any], field: str, reason: str
) -> None:
    data = {k: v for k, v in {**SMALL, **changes}.items() if v is not None}
    with pytest.raises(InvalidSpec) as exc:
        Workload.from_dict(data)
    assert exc.value.field == field and reason in exc.value.reason


# --- blis.conv2d -------------------------------------------------------------------------------
CASES = [
    {"pad_h": 1, "pad_w": 1, "batch": 2},
    {"kernel_w": 2, "stride_h": 2, "stride_w": 3, "pad_h": 2, "pad_w": 1, "dilation_h": 2},
    {"in_channels": 6, "out_channels": 4, "groups": 2, "pad_w": 1},
    {"in_channels": 8, "out_channels": 8, "groups": 8, "pad_h": 1, "pad_w": 1, "batch": 2},
    {"in_channels": 16, "out_channels": 24, "kernel_h": 1, "kernel_w": 1, "batch": 3},
    {"in_channels": 33, "out_channels": 20, "height": 13, "kernel_h": 5, "kernel_w": 5,
     "stride_h": 2, "stride_w": 2, "pad_h": 2, "pad_w": 2},
]  # fmt: skip


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_blis_conv2d_matches_the_reference_on_odd_shapes(layout: str, tmp_path: Path) -> None:
    """One kernel per (layout, threads) runs every shape (the shape is set per call); small
    blocks so that K, M and N each span several blocks and end in partial ones."""
    target = local_cpu_target()
    template = BlisConv2dTemplate()
    rng = np.random.default_rng(7)
    for dtype, threads in (("float32", 1), ("float64", 2)):
        first = conv(SMALL, data_layout=layout, dtype=dtype)
        config = template.default_config(first, target).replace(threads=threads, KC=16, MC=16)
        kernel = template.compile(first, target, config, tmp_path)
        for case in CASES:
            w = conv(SMALL, data_layout=layout, dtype=dtype, **case)
            x, f = conv_operands(w, rng)
            y = kernel.conv(w, x, f, conv_output(w))
            ok, rows, _, _, message = check_conv(y, x, f, w, rng)
            assert ok, (w.label, threads, message)
            assert rows == w.m * min(16, w.operator.multiplicity(w))


# Depthwise (groups == in_channels): the direct path. Each case is one filter width, stride and
# dilation along W (compiled in), with odd sizes, padding, stride and dilation along H, a
# channel multiplier, channels that end in a partial block, rows narrower than a tile.
DEPTHWISE = [
    {"in_channels": 21, "out_channels": 21, "groups": 21, "height": 13, "width": 37,
     "kernel_h": 7, "kernel_w": 7, "pad_h": 3, "pad_w": 3, "batch": 2},
    {"in_channels": 5, "out_channels": 15, "groups": 5, "kernel_w": 2, "stride_h": 2,
     "stride_w": 2, "dilation_h": 2, "dilation_w": 2, "pad_h": 2, "pad_w": 1},
    {"in_channels": 3, "out_channels": 6, "groups": 3, "height": 5, "width": 3, "pad_h": 1},
]  # fmt: skip


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_depthwise_conv2d_runs_the_direct_path_and_matches_the_reference(
    layout: str, tmp_path: Path
) -> None:
    from tunehub.kernels.conv2d_reference import reference_conv

    target = local_cpu_target()
    template = BlisConv2dTemplate()
    rng = np.random.default_rng(3)
    for i, case in enumerate(DEPTHWISE):
        dtype, threads = ("float32", 1) if i % 2 == 0 else ("float64", 2)
        w = conv(SMALL, data_layout=layout, dtype=dtype, **case)
        space = template.space(w, target)
        assert set(space.names) == {"ISA", "CB", "WB", "RR", "RB", "threads"}
        default = template.default_config(w, target)
        assert space.is_valid(default)
        assert all(space.is_valid(c) for c in template.seed_configs(w, target))
        # Four rows a unit; tiles that end past the row (moved back) or are wider than it (37,
        # 6 and 1 output columns); the widest channel block (a partial one).
        config = default.replace(threads=threads, RB=4, WB=4 if layout == "nhwc" else 2)
        config = config.replace(RR=1 if layout == "nhwc" else 3)  # a group of 3 rows and 1
        config = max(
            (config.replace(CB=cb) for cb in space.knobs[1].values),
            key=lambda c: int(c["CB"]) if space.is_valid(c.replace(threads=1)) else 0,
        )
        kernel = template.compile(w, target, config, tmp_path)
        x, f = conv_operands(w, rng)
        y = kernel.conv(w, x, f, conv_output(w))
        np.testing.assert_allclose(y, reference_conv(x, f, w), rtol=1e-4, atol=1e-4)
        assert check_conv(y, x, f, w, rng)[0]
    dense = conv(SMALL, data_layout=layout)
    refusal = r"runs depthwise \w+ convolutions with kernel_h=3, .* dilation_w=1; got"
    with pytest.raises(ValueError, match=refusal):
        kernel.conv(dense, *conv_operands(dense, rng), conv_output(dense))


def test_a_wrong_conv_is_a_wrong_answer() -> None:
    w = conv(SMALL, pad_h=1, batch=2)
    rng = np.random.default_rng(0)
    x, f = conv_operands(w, rng)
    y = conv_output(w)
    assert not check_conv(y, x, f, w, rng)[0]  # never written
    from tunehub.kernels.conv2d_reference import reference_conv

    y[...] = reference_conv(x, f, w)
    assert check_conv(y, x, f, w, rng)[0]
    y[1, 3, 0, 0] += 1e-3
    ok, _, _, _, message = check_conv(y, x, f, w, rng)
    assert not ok and message.startswith("image 1 group 0") and "C[0, 3]" in message


def test_blis_conv2d_and_torch_conv2d_measure_checked_times(tmp_path: Path) -> None:
    target = local_cpu_target()
    w = conv(SMALL, batch=2, pad_h=1, pad_w=1, data_layout="nhwc")
    timing = TimingPolicy(min_secs=0.02, max_repeats=5)
    for name in ("blis.conv2d", "torch.conv2d"):
        template = get_template(name)
        config = template.default_config(w, target)
        request = MeasureRequest(w, target, name, template.version, config)
        result = template.measure(request, build_dir=tmp_path, timing=timing)
        assert result.status is MeasureStatus.OK, result.error
        assert result.median_secs is not None and result.median_secs > 0
        assert result.environment["verify_rows"] == 2 * w.m
    assert get_template("blis.conv2d").baseline_template == "torch.conv2d"


def test_the_space_and_features_follow_the_layouts_gemm() -> None:
    target = local_cpu_target()
    template = get_template("blis.conv2d")
    nchw, nhwc = conv(RESNET), conv(RESNET, data_layout="nhwc", batch=4)
    # nchw's GEMM is O/groups x OH·OW: MC stays within 128 rows; nhwc's M is N·OH·OW.
    assert max(int(c["MC"]) for c in template.space(nchw, target).points) <= 128
    assert all(c["PACKB"] is True and c["PAR"] == "ic" for c in template.seed_configs(nhwc, target))
    fs = feature_set("blis.conv2d")
    configs = template.seed_configs(nhwc, target)
    x = fs.matrix(nhwc, target, configs)
    assert x.shape == (len(configs), len(fs.names)) and np.isfinite(x).all()
    assert x[0, fs.names.index("nhwc")] == 1.0 and x[0, fs.names.index("taps")] == 9.0
    y = fs.matrix(conv(RESNET, data_layout="nhwc", batch=8), target, configs)
    assert y[0, fs.names.index("log2_batch")] == 3.0
    assert x[0, fs.names.index("dw_accumulators")] == 0.0
    # A depthwise workload's configs are the direct path's: its knobs are features too.
    dw = conv(RESNET, out_channels=64, groups=64, data_layout="nhwc")
    configs = template.seed_configs(dw, target)
    z = fs.matrix(dw, target, configs)
    assert np.isfinite(z).all() and (z[:, fs.names.index("dw_wb")] > 0).all()
    assert z[0, fs.names.index("dw_accumulators")] == configs[0]["WB"]


# --- the API and the CLI -------------------------------------------------------------------------
@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    store = MemoryScheduleStore()
    app = create_app(Settings(home=tmp_path, run_jobs=False), store=store)
    with TestClient(app, base_url="http://127.0.0.1") as c:
        c.headers["X-API-Key"] = add_key(store)
        yield c


def test_a_conv2d_job_and_lookup_through_http(client: TestClient) -> None:
    spec = {**RESNET, "data_layout": "nhwc"}
    job = client.post("/api/v1/jobs", json={"workload": spec, "budget": {"max_trials": 2}})
    assert job.status_code == 202, job.text
    assert job.json()["template"] == "blis.conv2d"
    assert job.json()["workload"] == conv(RESNET, data_layout="nhwc").to_dict()
    params = {k: str(v) for k, v in spec.items()}
    answer = client.get("/api/v1/schedules/best", params=params)
    assert answer.status_code == 200, answer.text
    assert answer.json()["template"] == "blis.conv2d"
    assert answer.json()["workload_key"] == conv(RESNET, data_layout="nhwc").key
    bad = client.post("/api/v1/jobs", json={"workload": {**spec, "groups": 3}})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["body", "workload", "groups"], bad.text
    lookup = client.get("/api/v1/schedules/best", params={**params, "groups": "3"})
    assert lookup.status_code == 422 and "groups" in lookup.text
    missing = client.post("/api/v1/jobs", json={"workload": {"m": 8, "n": 8}})
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"][-1] == "k"
    batch = client.post(
        "/api/v1/schedules/lookup",
        json={"items": [{"workload": spec}, {"workload": {**spec, "kernel_w": 99}}]},
    ).json()["results"]
    assert batch[0]["ok"] and batch[0]["schedule"]["template"] == "blis.conv2d"
    assert not batch[1]["ok"] and batch[1]["loc"] == ["workload", "kernel_w"]
    operators = {o["name"]: o for o in client.get("/api/v1/operators").json()["items"]}
    fields = {f["name"]: f for f in operators["conv2d"]["fields"]}
    assert fields["data_layout"]["enum"] == ["nchw", "nhwc"]


def test_the_cli_takes_a_conv2d_by_its_fields(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tunehub.cli import main

    env = {"TUNEHUB_HOME": str(tmp_path), "TUNEHUB_MIN_REPEAT_SECS": "0.01"}
    given = ("in_channels=8", "out_channels=16", "height=10", "width=10", "kernel_h=3",
             "kernel_w=3", "pad_h=1", "pad_w=1", "data_layout=nhwc")  # fmt: skip
    fields = [part for item in given for part in ("--field", item)]
    runner = CliRunner()
    # M N K are left out: the workload is the fields' (tuning one takes a minute here: the
    # job's path is the HTTP test's).
    assert runner.invoke(main, ["db", "upgrade"], env=env).exit_code == 0
    found = runner.invoke(main, ["lookup", "--op", "conv2d", *fields], env=env)
    assert found.exit_code == 1, found.output  # an empty database: nothing tuned yet
    assert "no schedule known for conv2d 1x8x10x10 -> 16 k3x3 p1 nhwc float32" in found.output
    missing = runner.invoke(main, ["lookup", "8", "8"], env=env)
    assert missing.exit_code == 2 and "'K'" in missing.output
    bad = runner.invoke(main, ["tune", "--op", "conv2d", *fields, "--field", "groups=3"], env=env)
    assert bad.exit_code == 2 and "--field groups" in bad.output
