"""GPU bmm and grouped GEMM (issue 24): grouped_mm's spec, the triton.bmm and triton.grouped_mm
templates and their vendor baselines checked and timed through real sandboxes on the CPU
(Triton's interpreter), their kernels compiled for an H100 without one, their features, and
the API's 422s and lookups. GPU timings are taken by benchmarks on a GPU machine."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.test_api import add_key
from tests.test_local_measurer import PLUGIN_ENV
from tests.test_triton_template import H100
from tunehub.client.schedules import workload_fields, workload_tuple
from tunehub.core import Config, InvalidSpec, MeasureRequest, MeasureStatus, Workload
from tunehub.core.operators import get_operator
from tunehub.cost_model.features import feature_set
from tunehub.db import MemoryScheduleStore
from tunehub.kernels.base import BuildFailed, TimingPolicy, compile_errors
from tunehub.kernels.registry import get_template
from tunehub.kernels.triton_bmm import TritonBmmTemplate, TritonGroupedMmTemplate
from tunehub.service.app import create_app
from tunehub.service.settings import Settings
from tunehub.workers.local import LocalMeasurer

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None,
    reason="the interpreter tests need torch (CPU build) and Triton",
)
REPO = Path(__file__).resolve().parents[1]
GROUPED = {"op": "grouped_mm", "group_sizes": [5, 0, 17, 1], "m": 23, "n": 45, "k": 29}
BMM = {"op": "bmm", "batch": 3, "m": 37, "n": 45, "k": 29}


def grouped(**changes: Any) -> Workload:
    return Workload.from_dict({**GROUPED, **changes})


# --- grouped_mm's spec -----------------------------------------------------------------------
def test_a_grouped_workload_has_its_sizes_key_and_counts() -> None:
    w = grouped()
    assert w.params == (("group_sizes", (5, 0, 17, 1)),)
    assert w.label == "grouped_mm 23x45x29 groups=4 float32"
    assert w.flops == 2 * 23 * 45 * 29
    assert w.operand_bytes == 4 * (23 * 29 + 4 * 29 * 45 + 23 * 45)
    assert Workload.from_dict(w.to_dict()) == w
    assert len({w.key, grouped(group_sizes=[5, 17, 0, 1]).key, grouped(dtype="float16").key}) == 3
    field = get_operator("grouped_mm").field("group_sizes")
    assert field.parse("5,0,17,1") == (5, 0, 17, 1)
    assert field.to_dict()["type"] == "array" and field.to_dict()["maxItems"] == 64


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"group_sizes": [5, 0, 17]}, "m", "must equal the sum of group_sizes (22)"),
        ({"group_sizes": []}, "group_sizes", "must have 1 to 64 entries, got 0"),
        ({"group_sizes": [1] * 65, "m": 65}, "group_sizes", "got 65"),
        ({"group_sizes": [24, -1]}, "group_sizes", "entry 1 must be in [0, 65536]"),
        ({"group_sizes": [23.0]}, "group_sizes", "entry 0 must be an integer"),
        ({"group_sizes": "23"}, "group_sizes", "must be a list of integers"),
        ({"group_sizes": None}, "group_sizes", "must be a list of integers"),
        ({"epilogue": "bias"}, "epilogue", "fuses no bias"),
        ({"batch": 2}, "batch", "not a field of op grouped_mm"),
    ],
)
def test_a_bad_grouped_spec_names_the_field(
    changes: dict[str, Any], field: str, reason: str
) -> None:
    with pytest.raises(InvalidSpec) as info:
        grouped(**changes)
    assert info.value.field == field and reason in info.value.reason


def test_no_group_sizes_is_refused() -> None:
    with pytest.raises(InvalidSpec, match="group_sizes: is required"):
        Workload(op="grouped_mm", m=8, n=8, k=8)
    with pytest.raises(InvalidSpec, match="comma-separated"):
        get_operator("grouped_mm").field("group_sizes").parse("3;4")


def test_the_client_keys_a_list_field_as_a_tuple() -> None:
    key = workload_tuple(GROUPED)
    assert key[-1] == (("group_sizes", (5, 0, 17, 1)),)
    hash(key)
    assert Workload.from_dict(workload_fields(key)) == grouped()
    assert workload_tuple(grouped()) == key


# --- spaces (no torch, no Triton) ------------------------------------------------------------
def test_spaces_fit_the_shapes_and_the_device() -> None:
    bmm = Workload.from_dict({**BMM, "dtype": "float16"})
    space = TritonBmmTemplate().space(bmm, H100)
    assert {c["BLOCK_M"] for c in space.points} == {16, 32, 64}  # no tile taller than 37 rows
    assert {c["BATCH_MAJOR"] for c in space.points} == {True, False}
    big = Workload(op="bmm", m=4096, n=4096, k=4096, dtype="float16", params=(("batch", 2),))
    template = TritonBmmTemplate()
    huge = template.default_config(big, H100).replace(BLOCK_M=256, BLOCK_N=256, num_stages=5)
    reason = template.invalid_reason(big, H100, huge)
    assert reason is not None and ("shared memory" in reason or "registers" in reason)
    # A shared B: the entries of one tile run together first.
    shared = Workload.from_dict({**BMM, "b_broadcast": True})
    assert template.seed_configs(shared, H100)[0]["BATCH_MAJOR"] is False

    g = TritonGroupedMmTemplate()
    w = grouped(dtype="bfloat16")
    points = g.space(w, H100).points
    assert max(c["BLOCK_M"] for c in points) == 32  # the largest group has 17 rows
    assert all(c["PROGRAMS"] == 1 for c in points if c["SCHEDULE"] == "tile")
    assert {c["SCHEDULE"] for c in g.seed_configs(w, H100)} == {"tile", "persistent"}
    for name in ("triton.bmm", "triton.grouped_mm"):
        assert get_template(name).problem(w if "grouped" in name else bmm, H100) is None
    assert g.problem(grouped(dtype="float64"), H100) is not None


def test_features_see_the_batch_and_the_groups() -> None:
    for name, w in (
        ("triton.bmm", Workload.from_dict({**BMM, "dtype": "float16"})),
        ("triton.grouped_mm", grouped(dtype="float16")),
    ):
        points = get_template(name).space(w, H100).points
        features = feature_set(name)
        assert features.template == name
        x = features.matrix(w, H100, points)
        assert x.shape == (len(points), len(features.names)) and np.isfinite(x).all()
    tiles = features.names.index("group_tiles")
    # 16-row tiles: 1 + 0 + 2 + 1 rows of tiles for 5, 0, 17, 1 rows (BLOCK_N 32: 2 columns).
    row = next(i for i, c in enumerate(points) if c["BLOCK_M"] == 16 and c["BLOCK_N"] == 32)
    assert x[row, tiles] == 4 * 2


# --- through the sandboxes, on the CPU -------------------------------------------------------
INTERPRET_ENV = {**PLUGIN_ENV, "TRITON_INTERPRET": "1"}
FAST = TimingPolicy(min_secs=0.001, max_repeats=3)


@pytest.fixture(scope="module")
def interpreter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMeasurer]:
    measurer = LocalMeasurer(
        workdir=tmp_path_factory.mktemp("triton"), env=INTERPRET_ENV, timing=FAST, timeout_secs=300
    )
    yield measurer
    measurer.close()


def request(workload: Workload, config: Config, template: str) -> MeasureRequest:
    tmpl = get_template(template)
    return MeasureRequest(workload, H100, tmpl.name, tmpl.version, config)


@needs_triton
def test_bmm_strided_and_broadcast_match_the_reference(interpreter: LocalMeasurer) -> None:
    template = TritonBmmTemplate()
    requests = []
    for changes in (
        {"dtype": "float16"},
        {"dtype": "float32", "b_broadcast": True, "b_layout": "col_major"},
        {"dtype": "float32", "allow_tf32": True, "a_layout": "col_major"},
    ):
        w = Workload.from_dict({**BMM, **changes})
        seeds = template.seed_configs(w, H100)
        requests += [request(w, c, "triton.bmm") for c in seeds[:2]]
        requests.append(request(w, Config({"allow_tf32": w.allow_tf32}), "torch.bmm_gpu"))
    # The persistent TMA kernel (16-byte rows): each layout of A and B, a shared B, a K past
    # the last block, edge tiles along M and N, both batch orders, more tiles than programs.
    tile = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4,
            "num_stages": 3, "TMA": True}  # fmt: skip
    for changes, major in (
        ({"dtype": "float16", "m": 40, "n": 48, "k": 40}, True),
        ({"dtype": "float16", "m": 40, "n": 24, "k": 24, "a_layout": "col_major"}, False),
        ({"dtype": "float16", "m": 40, "n": 48, "k": 40, "b_layout": "col_major",
          "b_broadcast": True}, False),
        ({"dtype": "float32", "m": 20, "n": 12, "k": 36, "b_broadcast": True}, True),
    ):  # fmt: skip
        w = Workload.from_dict({**BMM, **changes})
        config = Config({**tile, "BATCH_MAJOR": major})
        assert template.space(w, H100).is_valid(config), w.label
        assert template.seed_configs(w, H100)[0]["TMA"] is True
        requests.append(request(w, config, "triton.bmm"))
    assert not any(c["TMA"] for c in template.space(Workload.from_dict(BMM), H100).points)
    results = interpreter.measure(requests)
    for req, result in zip(requests, results, strict=True):
        assert result.status is MeasureStatus.OK, (req.workload.label, req.config, result.error)
        assert result.repeat_secs and result.environment["relative_error"] < 2e-3
    assert results[2].environment["library_kernel"] == "torch.bmm"


@needs_triton
def test_grouped_mm_with_an_empty_group_matches_the_reference(interpreter: LocalMeasurer) -> None:
    template = TritonGroupedMmTemplate()
    requests = []
    for changes in (
        {"dtype": "float16"},
        {"dtype": "float32", "group_sizes": [0, 9, 30, 0, 2], "m": 41, "b_layout": "col_major"},
    ):
        w = grouped(**changes)
        for config in template.seed_configs(w, H100)[:2]:
            requests.append(request(w, config, "triton.grouped_mm"))
        requests.append(request(w, Config({"allow_tf32": False}), "torch.grouped_mm"))
    # GROUP_M larger than the group's rows of tiles, one 16-row tile per program, persistent.
    w = grouped(dtype="float16")
    tile = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}
    for schedule, programs in (("tile", 1), ("persistent", 1), ("persistent", 4)):
        config = Config({**tile, "GROUP_M": 8, "SCHEDULE": schedule, "PROGRAMS": programs,
                         "TMA": False})  # fmt: skip
        assert template.space(w, H100).is_valid(config)
        requests.append(request(w, config, "triton.grouped_mm"))
    # The TMA kernel (16-byte rows): a K past the last block, tiles reading the next group's
    # rows, an empty group, both schedules; its seeds come first.
    aligned = grouped(dtype="float16", k=40, n=48)
    for schedule, programs in (("tile", 1), ("persistent", 2)):
        config = Config({**tile, "GROUP_M": 8, "SCHEDULE": schedule, "PROGRAMS": programs,
                         "TMA": True})  # fmt: skip
        assert template.space(aligned, H100).is_valid(config)
        requests.append(request(aligned, config, "triton.grouped_mm"))
    assert template.seed_configs(aligned, H100)[0]["TMA"] is True
    assert not any(c["TMA"] for c in template.space(w, H100).points)  # 58-byte rows of A
    results = interpreter.measure(requests)
    for req, result in zip(requests, results, strict=True):
        assert result.status is MeasureStatus.OK, (req.workload.label, req.config, result.error)
        assert result.environment["relative_error"] < 2e-3
    baseline = results[2].environment
    assert baseline["library_kernel"] in ("torch._grouped_mm", "torch.mm per group")
    assert baseline["library_kernel"] == "torch._grouped_mm" or baseline["grouped_mm_refused"]


@needs_triton
def test_a_kernel_that_skips_a_group_is_a_wrong_answer() -> None:
    """The check is not blind: C's rows of a group the kernel never reaches stay NaN."""
    code = (
        "import os; os.environ['TRITON_INTERPRET'] = '1'\n"
        "import torch\n"
        "from tunehub.core import Workload\n"
        "from tunehub.kernels import gpu_reference as ref\n"
        "from tunehub.kernels import triton_bmm as tb, triton_bmm_kernels as tk\n"
        f"w = Workload.from_dict({GROUPED!r})\n"
        "ops = tb.grouped_operands(w, torch.device('cpu'), 3)\n"
        "cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2,\n"
        "           SCHEDULE='tile', PROGRAMS=1)\n"
        "ops.offsets[4] = 22  # the kernel is told the last group ends a row early\n"
        "tk.grouped_launch(ops.a, ops.b, ops.out, ops.offsets, cfg, False, 3)()\n"
        "ops.offsets[4] = 23\n"
        "check = ref.check(ops.out, tb.grouped_reference(ops), w)\n"
        "assert not check.ok and 'not finite' in check.message, check\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, env=env)


@needs_triton
def test_a_compile_failure_is_a_build_error_and_a_refused_config_invalid() -> None:
    # What every Triton template's build makes of its compile step's exceptions.
    with pytest.raises(BuildFailed) as failed, compile_errors(0.0):
        raise RuntimeError("ptxas error: Entry function uses too much shared data")
    assert failed.value.status is MeasureStatus.BUILD_ERROR and failed.value.compile_secs > 0
    assert failed.value.message.startswith("RuntimeError: ptxas error")
    with pytest.raises(BuildFailed) as refused, compile_errors(0.0, invalid=(ValueError,)):
        raise ValueError("BLOCK_K 256 is past K")
    assert refused.value.status is MeasureStatus.INVALID
    assert refused.value.message == "BLOCK_K 256 is past K"


def test_build_compiles_the_kernels_for_an_h100_without_one(tmp_path: Path) -> None:
    """The build sandbox's path: Triton compiles for sm_90 into its cache, no GPU needed."""
    code = (
        "from pathlib import Path\n"
        "from tunehub.core import Config, MeasureRequest, Target, Workload\n"
        "from tunehub.kernels.registry import get_template\n"
        f"h100 = Target.from_dict({H100.to_dict()!r})\n"
        "for name, spec in (\n"
        "    ('triton.bmm', {'op': 'bmm', 'batch': 8, 'm': 512, 'n': 256, 'k': 64,\n"
        "                    'b_broadcast': True, 'dtype': 'float16'}),\n"
        "    ('triton.bmm', {'op': 'bmm', 'batch': 4, 'm': 256, 'n': 512, 'k': 128,\n"
        "                    'a_layout': 'col_major', 'dtype': 'bfloat16'}),\n"
        "    ('triton.grouped_mm', {'op': 'grouped_mm', 'group_sizes': [100, 0, 300],\n"
        "                           'm': 400, 'n': 256, 'k': 128, 'dtype': 'bfloat16'}),\n"
        "):\n"
        "    t = get_template(name)\n"
        "    w = Workload.from_dict(spec)\n"
        "    c = t.default_config(w, h100)\n"
        "    assert c.get('TMA', True), c  # the TMA kernels lead the seeds on Hopper\n"
        "    art = t.build(MeasureRequest(w, h100, name, t.version, c), build_dir=Path('.'))\n"
        "    assert art.key != 'interpreter' and art.environment['shared_bytes'] > 0, art\n"
        "t = get_template('triton.attention')\n"
        "w = Workload.from_dict({'op': 'attention', 'batch': 2, 'heads': 4, 'm': 300, 'n': 300,\n"
        "                        'k': 64, 'causal': True, 'dtype': 'float16'})\n"
        "seeds = t.seed_configs(w, h100)\n"
        "for c in (seeds[0], next(c for c in seeds if c['TMA'])):  # pointer loads, TMA\n"
        "    art = t.build(MeasureRequest(w, h100, t.name, t.version, c), build_dir=Path('.'))\n"
        "    assert art.environment['build'] == 'ahead' and art.compile_secs > 0, art\n"
        "    assert art.environment['shared_bytes'] > 0 and art.environment['registers'], art\n"
        "    assert not art.environment['warp_specialized'], art\n"
        "# Causal and warp-specialised: Triton splits the key loop (its mask written so the\n"
        "# split keeps each consumer warpgroup's rows right; the H200 run checks the outputs).\n"
        "ws = {**seeds[0].to_dict(), 'BLOCK_M': 128, 'BLOCK_N': 64, 'num_warps': 4,\n"
        "      'num_stages': 2, 'TMA': True, 'WARP_SPECIALIZE': True, 'GLUON': False}\n"
        "req = MeasureRequest(w, h100, t.name, t.version, Config(ws))\n"
        "assert t.invalid_reason(w, h100, Config(ws)) is None\n"
        "assert t.build(req, build_dir=Path('.')).environment['warp_specialized']\n"
        "# The Gluon kernel builds ahead too: the key its launch on real tensors computes.\n"
        "import torch\n"
        "from triton.backends.compiler import GPUTarget\n"
        "from tunehub.kernels.triton_gemm_kernels import _compile_like_jit\n"
        "from tunehub.kernels import triton_attention_gluon as gk\n"
        "from tunehub.kernels import triton_attention_kernels as ak\n"
        "w = Workload.from_dict({'op': 'attention', 'batch': 2, 'heads': 4, 'm': 256, 'n': 256,\n"
        "                        'k': 64, 'causal': True, 'dtype': 'float16'})\n"
        "glu = {**ws, 'BLOCK_M': 64, 'WARP_SPECIALIZE': False, 'GLUON': True}\n"
        "assert t.invalid_reason(w, h100, Config(glu)) is None\n"
        "req = MeasureRequest(w, h100, t.name, t.version, Config(glu))\n"
        "art = t.build(req, build_dir=Path('.'))\n"
        "assert art.environment['build'] == 'ahead' and art.environment['registers'], art\n"
        "ops = ak.operands(w, torch.device('cpu'), seed=1)\n"
        "shapes = (2, 4, 256, 256, 64)\n"
        "_, args, kw = gk.launch_args(ops.q, ops.k, ops.v, ops.out, shapes, True, glu)\n"
        "key = _compile_like_jit(gk._gluon_attention_fwd, GPUTarget('cuda', 90, 32), args, kw)\n"
        "assert art.key == str(key[0].hash), (art.key, key[0].hash)\n"
        "# Lengths of no whole tiles: the masked last key block and the pointer store of O.\n"
        "w = Workload.from_dict({**w.to_dict(), 'm': 300, 'n': 257})\n"
        "req = MeasureRequest(w, h100, t.name, t.version, Config(glu))\n"
        "art = t.build(req, build_dir=Path('.'))\n"
        "ops = ak.operands(w, torch.device('cpu'), seed=1)\n"
        "shapes = (2, 4, 300, 257, 64)\n"
        "_, args, kw = gk.launch_args(ops.q, ops.k, ops.v, ops.out, shapes, True, glu)\n"
        "assert not kw['EVEN_M'] and not kw['EVEN_N'], kw\n"
        "key = _compile_like_jit(gk._gluon_attention_fwd, GPUTarget('cuda', 90, 32), args, kw)\n"
        "assert art.key == str(key[0].hash), (art.key, key[0].hash)\n"
        "import torch\n"
        "from triton.backends.compiler import GPUTarget\n"
        "from tunehub.kernels import triton_conv_kernels as ck\n"
        "from tunehub.kernels.triton_gemm_kernels import _compile_like_jit\n"
        "t = get_template('triton.conv2d')\n"
        "conv = {'op': 'conv2d', 'batch': 2, 'in_channels': 64, 'out_channels': 64,\n"
        "        'height': 14, 'width': 14, 'kernel_h': 3, 'kernel_w': 3, 'pad_h': 1, 'pad_w': 1,\n"
        "        'dtype': 'float16'}\n"
        "built = set()\n"
        "for spec in ({**conv, 'data_layout': 'nhwc'}, {**conv, 'data_layout': 'nchw'},\n"
        "             {**conv, 'data_layout': 'nhwc', 'groups': 64},\n"
        "             {**conv, 'in_channels': 3, 'kernel_h': 7, 'kernel_w': 7, 'pad_h': 3,\n"
        "              'pad_w': 3, 'stride_h': 2, 'stride_w': 2, 'data_layout': 'nhwc',\n"
        "              'height': 32, 'width': 32}):\n"
        "    w = Workload.from_dict(spec)\n"
        "    seeds = t.seed_configs(w, h100)\n"
        "    picks = [c for c in seeds if c.get('TMA')][:1] + seeds[:1]\n"
        "    for c in picks + [c for c in seeds if c.get('PATCH') == 'rows'][:1]:\n"
        "        req = MeasureRequest(w, h100, t.name, t.version, c)\n"
        "        art = t.build(req, build_dir=Path('.'))\n"
        "        assert art.environment['build'] == 'ahead' and art.compile_secs > 0, (spec, c)\n"
        "        built.add((c.get('TMA'), c.get('PATCH'), c.get('REPACK'), 'TILE_W' in c))\n"
        "        # The run's launches on real tensors: the same cache keys (a CPU tensor is\n"
        "        # 16-byte aligned as a CUDA one is, with the same strides).\n"
        "        ops = ck.operands(w, torch.device('cpu'), seed=1)\n"
        "        keys = [str(_compile_like_jit(x.kernel, GPUTarget('cuda', 90, 32), x.args,\n"
        "                                      x.kwargs)[0].hash)\n"
        "                for x in ck.conv_launches(ops.x, ops.w, ops.out, w, c.to_dict())]\n"
        "        assert art.key == '+'.join(keys), (spec, c)\n"
        "# TMA in place and after the channels-last copies, padded rows, the depthwise kernel.\n"
        "assert {(True, 'tap', False, True), (False, 'rows', False, True)} <= built, built\n"
        "assert {(None, None, False, True), (True, 'tap', True, True)} <= built, built\n"
        "# Pointwise: triton.gemm's kernels (NHWC) and triton.bmm's (NCHW), as a 132-SM GPU\n"
        "# launches them (their persistent kernels take the SM count as a constant).\n"
        "import tunehub.kernels.triton_bmm_kernels as tbk\n"
        "import tunehub.kernels.triton_gemm_kernels as tg\n"
        "tg.sm_count = tbk.sm_count = lambda device: h100.cores\n"
        "one = {**conv, 'kernel_h': 1, 'kernel_w': 1, 'pad_h': 0, 'pad_w': 0, 'height': 16,\n"
        "       'width': 16}\n"
        "for layout, key in (('nhwc', 'variant'), ('nchw', 'BATCH_MAJOR')):\n"
        "    w = Workload.from_dict({**one, 'data_layout': layout})\n"
        "    c = t.default_config(w, h100)\n"
        "    assert key in c, c\n"
        "    art = t.build(MeasureRequest(w, h100, t.name, t.version, c), build_dir=Path('.'))\n"
        "    assert art.environment['build'] == 'ahead' and art.compile_secs > 0, (layout, c)\n"
        "    ops = ck.operands(w, torch.device('cpu'), seed=1)\n"
        "    if layout == 'nhwc':\n"
        "        launches = ck.bind(ops, c.to_dict()).launches\n"
        "    else:\n"
        "        launches = [ck._bmm_route(ops.x, ops.w, ops.out, w, c.to_dict())]\n"
        "    keys = [str(_compile_like_jit(x.kernel, GPUTarget('cuda', 90, 32), x.args,\n"
        "                                  x.kwargs)[0].hash) for x in launches]\n"
        "    assert art.key == '+'.join(keys), (layout, c)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, env=env, timeout=300)


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
        ({**GROUPED, "group_sizes": []}, ["body", "workload", "group_sizes"]),
        ({**GROUPED, "group_sizes": [5, -1]}, ["body", "workload", "group_sizes"]),
        ({**GROUPED, "group_sizes": "5,0"}, ["body", "workload", "group_sizes"]),
        ({**GROUPED, "m": 24}, ["body", "workload", "m"]),
        ({**GROUPED, "group_sizes": [1] * 65, "m": 65}, ["body", "workload", "group_sizes"]),
    ],
)
def test_a_bad_grouped_job_is_a_422_naming_the_field(
    client: TestClient, workload: dict[str, Any], loc: list[str]
) -> None:
    response = client.post("/api/v1/jobs", json={"workload": workload})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == loc, response.text


def test_grouped_lookups_and_the_operators_list(client: TestClient) -> None:
    # No GPU target here: the local CPU has no grouped_mm template, which the job names.
    job = client.post("/api/v1/jobs", json={"workload": GROUPED})
    assert job.status_code == 422 and job.json()["detail"][0]["loc"] == ["body", "workload", "op"]
    query = {**GROUPED, "group_sizes": "5,0,17,1"}
    answer = client.get("/api/v1/schedules/best", params=query)
    assert answer.status_code in (200, 404), answer.text
    bad = client.get("/api/v1/schedules/best", params={**query, "group_sizes": "5,x"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "group_sizes"]
    batch = client.post(
        "/api/v1/schedules/lookup",
        json={"items": [{"workload": GROUPED}, {"workload": {**GROUPED, "group_sizes": [1]}}]},
    ).json()["results"]
    assert not batch[1]["ok"] and batch[1]["loc"] == ["workload", "m"]
    operators = {o["name"]: o for o in client.get("/api/v1/operators").json()["items"]}
    fields = operators["grouped_mm"]["fields"]
    assert [f["name"] for f in fields] == ["group_sizes"] and fields[0]["type"] == "array"
    names = {t["name"] for t in operators["grouped_mm"]["templates"]}
    assert {"triton.grouped_mm", "torch.grouped_mm"} <= names
    assert "triton.bmm" in {t["name"] for t in operators["bmm"]["templates"]}
