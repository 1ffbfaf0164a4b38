"""The triton.gemm template and the torch.matmul baseline: spaces from the device's fingerprint
(without torch), and build + check + time through real sandboxes on the CPU, the kernels run by
Triton's interpreter (the GPU run checks the same code on an H100: benchmarks/gpu_gemm.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live import run_script
from tests.test_local_measurer import PLUGIN_ENV
from tunehub.core import Config, MeasureRequest, MeasureStatus, Target, Workload
from tunehub.core.capabilities import Unsupported
from tunehub.kernels.base import TimingPolicy
from tunehub.kernels.registry import get_template
from tunehub.kernels.triton_gemm import TritonGemmTemplate, device_props, kernel_config
from tunehub.workers.local import LocalMeasurer

# Only looked up, not imported: Triton must first be imported with TRITON_INTERPRET set (see
# test_triton_kernels), and these tests run the kernels in sandboxes of their own.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None,
    reason="the interpreter tests need torch (CPU build) and Triton",
)

REPO = Path(__file__).resolve().parents[1]
H100 = Target(
    kind="cuda",
    name="NVIDIA H100 80GB HBM3",
    arch=("sm_90",),
    cores=132,
    vendor="nvidia",
    l2_bytes=50 << 20,
    properties={"compute_capability": 90, "smem_per_block_bytes": 232448, "regs_per_sm": 65536},
)
A100 = Target(
    kind="cuda",
    name="NVIDIA A100",
    arch=("sm_80",),
    cores=108,
    properties={"compute_capability": 80, "smem_per_block_bytes": 166912, "regs_per_sm": 65536},
)
TEMPLATE = TritonGemmTemplate()


def test_the_template_and_its_space_need_neither_torch_nor_triton() -> None:
    code = (
        "import sys\n"
        "from tunehub.kernels.registry import get_template\n"
        "from tunehub.core import Target, Workload\n"
        f"h100 = Target.from_dict({H100.to_dict()!r})\n"
        "t = get_template('triton.gemm')\n"
        "w = Workload(m=512, n=512, k=512, dtype='float16')\n"
        "assert len(t.space(w, h100)) > 100 and t.seed_configs(w, h100)\n"
        "heavy = [m for m in ('torch', 'triton') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_space_follows_the_device_and_the_workload() -> None:
    big = Workload(m=4096, n=4096, k=4096, dtype="float16")
    h100 = TEMPLATE.space(big, H100)
    a100 = TEMPLATE.space(big, A100)
    assert {c["variant"] for c in h100.points} == {"tiled", "persistent", "tma", "ws"}
    assert {c["variant"] for c in a100.points} == {"tiled", "persistent"}  # no TMA before sm_90
    assert len(h100) > len(a100)
    skinny = TEMPLATE.space(Workload(m=16, n=4096, k=4096, dtype="float16"), H100)
    assert {c["BLOCK_M"] for c in skinny.points} == {16}  # no tile taller than the problem
    odd_k = TEMPLATE.space(Workload(m=1000, n=3000, k=777, dtype="float16"), H100)
    # TMA needs 16-byte rows: only with K padded to 784 (copies of A and B, every call).
    assert {c["variant"] for c in odd_k.points if not c["PAD_K"]} == {
        "tiled",
        "persistent",
        "splitk",
        "splitk_atomic",
    }
    assert "tma" in {c["variant"] for c in odd_k.points if c["PAD_K"]}
    assert "PAD_K" not in h100.names  # no knob where padding changes nothing
    long_k = TEMPLATE.space(Workload(m=256, n=256, k=65536, dtype="float16"), H100)
    assert max(c["SPLIT_K"] for c in long_k.points) > 1
    assert all(c["SPLIT_K"] == 1 for c in h100.points)  # 4096^2 fills the GPU already
    assert {c["variant"] for c in long_k.points if c["SPLIT_K"] > 1} == {
        "tiled",
        "splitk",
        "splitk_atomic",
    }
    # The one-kernel split-Ks exist only split: with SPLIT_K=1 they would be 'tiled'.
    one_kernel = ("splitk", "splitk_atomic")
    assert all(c["SPLIT_K"] > 1 for c in long_k.points if c["variant"] in one_kernel)
    assert not {"splitk", "splitk_atomic"} & {c["variant"] for c in h100.points}
    for config in h100.points[:: max(1, len(h100) // 50)]:
        assert TEMPLATE.invalid_reason(big, H100, config) is None


def test_a_config_that_cannot_run_says_why() -> None:
    w = Workload(m=4096, n=4096, k=4096, dtype="float16")
    huge = TEMPLATE.default_config(w, H100).replace(BLOCK_K=256, num_stages=6)
    reason = TEMPLATE.invalid_reason(w, H100, huge)
    assert reason is not None and "shared memory" in reason
    ws_deep = Config(
        {
            **TEMPLATE.default_config(w, H100).to_dict(),
            "variant": "ws",
            "num_warps": 4,
            "num_stages": 5,
        }
    )
    reason = TEMPLATE.invalid_reason(w, H100, ws_deep)
    assert reason is not None and "NaN" in reason


def test_defaults_and_seeds_fit_the_shape() -> None:
    cases = {
        (4096, 4096, 4096): "tma",
        (16, 4096, 4096): "tiled",
        # K = 777 in fp16: rows not 16-byte aligned; one padding launch brings TMA back.
        (1000, 3000, 777): "tma",
        (256, 256, 65536): "splitk_atomic",  # one-kernel split-K: faster on the H100
    }
    for (m, n, k), variant in cases.items():
        w = Workload(m=m, n=n, k=k, dtype="float16")
        default = TEMPLATE.default_config(w, H100)
        assert default["variant"] == variant, (m, n, k, default)
        seeds = TEMPLATE.seed_configs(w, H100)
        assert seeds[0] == default and len(set(seeds)) == len(seeds)
        space = TEMPLATE.space(w, H100)
        assert all(space.is_valid(s) for s in seeds)
    assert (
        TEMPLATE.default_config(Workload(m=256, n=256, k=65536, dtype="float16"), H100)["SPLIT_K"]
        > 1
    )
    odd = TEMPLATE.default_config(Workload(m=1000, n=3000, k=777, dtype="float16"), H100)
    # 128x192 tiles: 128 of 1000x3000 for the 132 SMs, where 128x256 makes 96.
    assert (odd["PAD_K"], odd["BLOCK_M"], odd["BLOCK_N"]) == (True, 128, 192)
    one_wave = TEMPLATE.default_config(Workload(m=1024, n=1024, k=1024, dtype="float16"), H100)
    assert (one_wave["variant"], one_wave["BLOCK_M"], one_wave["BLOCK_N"]) == ("tma", 64, 128)
    assert "FLATTEN" not in kernel_config(Config({"variant": "tiled", "FLATTEN": False}))
    assert "FLATTEN" not in kernel_config(Config({"variant": "splitk", "FLATTEN": False}))
    assert "FLATTEN" not in kernel_config(Config({"variant": "splitk_atomic", "FLATTEN": False}))
    long_k = TEMPLATE.seed_configs(Workload(m=256, n=256, k=65536, dtype="float16"), H100)
    # Atomics first, the bit-reproducible split next; each split so the programs come nearest
    # one wave of the 132 SMs (16 tiles of 64x64 split 8, 8 of 64x128 split 16).
    assert [(s["variant"], s["BLOCK_N"], s["SPLIT_K"]) for s in long_k[:4]] == [
        ("splitk_atomic", 64, 8),
        ("splitk_atomic", 64, 16),
        ("splitk_atomic", 128, 16),
        ("splitk_atomic", 128, 32),
    ]
    assert any(s["variant"] == "splitk" for s in long_k)
    skinny_k = TEMPLATE.seed_configs(Workload(m=128, n=128, k=32768, dtype="float16"), H100)
    assert (skinny_k[0]["variant"], skinny_k[0]["SPLIT_K"]) == ("splitk_atomic", 32)


@pytest.mark.parametrize(
    ("workload", "target", "field"),
    [
        (Workload(m=8, n=8, k=8, dtype="float64"), H100, "workload.dtype"),
        (Workload(m=8, n=8, k=8, dtype="float8_e4m3"), A100, "workload.dtype"),
        (Workload(m=8, n=8, k=8), Target(kind="cpu", name="x", arch=(), cores=2), "target"),
    ],
)
def test_what_triton_cannot_run_is_named(workload: Workload, target: Target, field: str) -> None:
    with pytest.raises(Unsupported) as info:
        TEMPLATE.check(workload, target)
    assert info.value.field == field
    assert TEMPLATE.problem(Workload(m=8, n=8, k=8, dtype="float8_e4m3"), H100) is None
    assert TEMPLATE.problem(Workload(m=8, n=8, k=8, allow_tf32=True), H100) is None
    assert device_props(H100)["sm_count"] == 132


# --- through the sandboxes, on the CPU ---------------------------------------------------------
INTERPRET_ENV = {**PLUGIN_ENV, "TRITON_INTERPRET": "1"}
FAST = TimingPolicy(min_secs=0.001, max_repeats=3)


def request(workload: Workload, config: Config, template: str = "triton.gemm") -> MeasureRequest:
    tmpl = get_template(template)
    return MeasureRequest(workload, H100, tmpl.name, tmpl.version, config)


def small_config(variant: str, **changes: int) -> Config:
    base: dict[str, object] = {
        "variant": variant,
        "BLOCK_M": 32,
        "BLOCK_N": 32,
        "BLOCK_K": 32,
        "num_warps": 4,
        "num_stages": 3,
        "GROUP_M": 4,
        "SPLIT_K": 1,
        "FLATTEN": False,
    }
    base.update(changes)
    return Config(base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def interpreter(tmp_path_factory: pytest.TempPathFactory) -> LocalMeasurer:
    measurer = LocalMeasurer(
        workdir=tmp_path_factory.mktemp("triton"), env=INTERPRET_ENV, timing=FAST, timeout_secs=300
    )
    yield measurer  # type: ignore[misc]
    measurer.close()


def test_every_variant_is_checked_and_timed_through_the_sandboxes(
    interpreter: LocalMeasurer,
) -> None:
    workload = Workload(
        m=64, n=48, k=160, dtype="float16", epilogue="bias_gelu", b_layout="col_major"
    )
    requests = [
        request(workload, small_config("tiled")),
        request(workload, small_config("tiled", SPLIT_K=2)),
        request(workload, small_config("splitk", SPLIT_K=2)),  # 5 K tiles: 3 + 2
        request(workload, small_config("persistent")),
        request(workload, small_config("tma")),
        request(workload, small_config("ws", BLOCK_M=64, num_stages=3)),
    ]
    results = interpreter.measure(requests)
    for req, result in zip(requests, results, strict=True):
        assert result.status is MeasureStatus.OK, (req.config.to_dict(), result.error)
        assert result.repeat_secs and result.environment["relative_error"] < 2e-3
        assert result.environment["device"].startswith("cpu")


def test_the_cublas_baseline_runs_the_same_way(interpreter: LocalMeasurer) -> None:
    for dtype, tf32 in (("float16", False), ("float32", True)):
        workload = Workload(m=40, n=24, k=56, dtype=dtype, epilogue="bias_relu", allow_tf32=tf32)
        config = get_template("torch.matmul").baseline_configs(workload, H100)[0]
        assert config == Config({"allow_tf32": tf32})
        (result,) = interpreter.measure([request(workload, config, "torch.matmul")])
        assert result.status is MeasureStatus.OK, result.error
        assert result.environment["library"] == "cuBLAS"


def test_padding_k_computes_the_same_product(interpreter: LocalMeasurer) -> None:
    workload = Workload(m=40, n=24, k=37, dtype="float16", epilogue="bias", b_layout="col_major")
    space = TEMPLATE.space(workload, H100)
    tma = small_config("tma").replace(PAD_K=True)
    assert space.is_valid(tma) and not space.is_valid(small_config("tma").replace(PAD_K=False))
    results = interpreter.measure(
        [request(workload, tma), request(workload, small_config("tiled").replace(PAD_K=True))]
    )
    for result in results:
        assert result.status is MeasureStatus.OK, result.error
        assert result.environment["relative_error"] < 2e-3


def test_a_config_outside_the_space_is_invalid_before_any_compile(
    interpreter: LocalMeasurer,
) -> None:
    workload = Workload(m=64, n=64, k=64, dtype="float16")
    (result,) = interpreter.measure([request(workload, small_config("tiled", BLOCK_K=24))])
    assert result.status is MeasureStatus.INVALID and "not in the space" in result.error


def test_build_compiles_for_the_gpu_on_a_machine_without_one(tmp_path: Path) -> None:
    """The build stage needs no GPU: Triton compiles the sm_90 kernel here, into the cache the
    run sandbox will read, and reports its registers and shared memory."""
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from tunehub.core import Config, MeasureRequest, Target, Workload\n"
        "from tunehub.kernels.triton_gemm import TritonGemmTemplate\n"
        f"h100 = Target.from_dict({H100.to_dict()!r})\n"
        "t = TritonGemmTemplate()\n"
        "w = Workload(m=256, n=256, k=256, dtype='bfloat16', epilogue='bias')\n"
        "c = t.default_config(w, h100)\n"
        "r = MeasureRequest(w, h100, t.name, t.version, c)\n"
        "a = t.build(r, build_dir=Path(sys.argv[1]))\n"
        "again = t.build(r, build_dir=Path(sys.argv[1]))\n"
        "print(json.dumps([a.environment, again.cached, a.key == again.key]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    environment, cached, same = run_script(code, str(tmp_path), env=env)
    assert environment["registers"] > 0 and environment["shared_bytes"] > 0
    assert cached is True and same is True  # the second build is a cache hit
    assert any((tmp_path / "triton").rglob("*.cubin"))


def test_the_split_k_benchmark_plans_few_kernels_and_runs_under_the_interpreter(
    tmp_path: Path,
) -> None:
    # The GPU step (`gpu_run.sh splitk`) must stay within its minutes: a fixed, small plan.
    script = str(REPO / "benchmarks" / "probes" / "gpu_splitk.py")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TRITON_INTERPRET", None)
    plan = subprocess.run(
        [sys.executable, script, "--dry-run"], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert plan.count("cuBLAS  cuBLAS") == 4
    assert plan.count("one-kernel split-K  splitk") == plan.count("two-kernel split-K  tiled")
    assert int(plan.rsplit("# ", 1)[1].split()[0]) <= 70
    # Its whole path (bind, check, repeat check, timing, table, JSON) on the CPU.
    out = tmp_path / "splitk.json"
    subprocess.run(
        [sys.executable, script, "--interpret", "--shape", "32x48x640", "--rounds", "1",
         "--min-secs", "0", "--out", str(out)],
        env=env, capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert report["failures"] == []
    contenders = report["cases"][0]["contenders"]
    roles = {c["role"] for c in contenders if c["ok"] and c["tflops"]}
    assert roles == {"one-kernel split-K", "two-kernel split-K", "non-split", "cuBLAS"}
    for c in contenders:
        if c["role"] == "one-kernel split-K":
            assert c["launches"] == 1 and c["repeatable"] and c["counters_zero"]
        elif c["role"] == "two-kernel split-K":
            assert c["launches"] == 2
    assert report["summary"][0]["best"]["one-kernel split-K"].startswith("splitk ")
