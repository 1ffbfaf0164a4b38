"""The numpy.matmul Baseline template and the Python timing loop, on real numpy/OpenBLAS."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tunehub.core import Config, MeasureRequest, MeasureStatus, Workload, local_cpu_target
from tunehub.kernels.base import TimingPolicy
from tunehub.kernels.numpy_gemm import NumpyGemmBaseline
from tunehub.kernels.registry import get_template
from tunehub.kernels.timing import current_cpu, pinned_to_current_cpu, time_calls


def request(workload: Workload, threads: int = 1) -> MeasureRequest:
    return MeasureRequest(
        workload, local_cpu_target(), "numpy.matmul", 1, Config({"threads": threads})
    )


@pytest.mark.parametrize("epilogue", ["none", "bias", "bias_relu"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_baseline_measures_ok_with_every_repeat(tmp_path: Path, dtype: str, epilogue: str) -> None:
    workload = Workload(m=67, n=45, k=33, dtype=dtype, epilogue=epilogue)
    result = NumpyGemmBaseline().measure(
        request(workload), build_dir=tmp_path, timing=TimingPolicy(min_secs=0.02, max_repeats=20)
    )
    assert result.status is MeasureStatus.OK, result.error
    assert 3 <= len(result.repeat_secs) <= 20
    assert result.median_secs is not None and result.median_secs > 0
    env = result.environment
    assert env["threads"] == 1 and env["numpy"] and env["calls_per_repeat"] >= 1
    assert "blas" in env  # which library numpy runs, for the lookup's answer
    assert env["pinned_cpu"] in os.sched_getaffinity(0)


def test_baseline_thread_knob_is_bounded_by_the_cores(tmp_path: Path) -> None:
    template = get_template("numpy.matmul")
    target = local_cpu_target()
    workload = Workload(m=8, n=8, k=8)
    assert [c["threads"] for c in template.space(workload, target).points] == list(
        range(1, target.cores + 1)
    )
    result = template.measure(
        request(workload, threads=target.cores + 1),
        build_dir=tmp_path,
        timing=TimingPolicy(min_secs=0.01, max_repeats=5),
    )
    assert result.status is MeasureStatus.INVALID
    assert "not in the space" in result.error


def test_baselines_are_not_offered_for_tuning() -> None:
    problem = NumpyGemmBaseline().problem(Workload(m=8, n=8, k=8), local_cpu_target())
    assert problem is not None and "baseline" in problem.reason and problem.field == "template"


def test_baseline_configs_are_one_thread_and_every_core() -> None:
    target = local_cpu_target()
    configs = NumpyGemmBaseline().baseline_configs(Workload(m=8, n=8, k=8), target)
    assert [c["threads"] for c in configs] == sorted({1, target.cores})


def test_baseline_reads_column_major_operands(tmp_path: Path) -> None:
    workload = Workload(m=37, n=29, k=41, a_layout="col_major", b_layout="col_major")
    result = NumpyGemmBaseline().measure(
        request(workload), build_dir=tmp_path, timing=TimingPolicy(min_secs=0.01, max_repeats=3)
    )
    assert result.status is MeasureStatus.OK, result.error


def test_time_calls_follows_the_repeat_policy() -> None:
    calls = []
    timing = time_calls(lambda: calls.append(1), min_secs=0.01, max_repeats=7)
    assert 3 <= len(timing.repeat_secs) <= 7
    assert timing.calls_per_repeat > 1  # a tiny call is batched into each repeat
    assert len(calls) >= timing.calls_per_repeat * len(timing.repeat_secs)
    assert all(t > 0 for t in timing.repeat_secs)
    one = time_calls(lambda: None, min_secs=10.0, max_repeats=1)
    assert len(one.repeat_secs) == 1
    with pytest.raises(ValueError, match="max_repeats"):
        time_calls(lambda: None, min_secs=0.01, max_repeats=0)


def test_pinning_holds_the_thread_on_one_cpu_and_restores_it() -> None:
    before = os.sched_getaffinity(0)
    with pinned_to_current_cpu() as cpu:
        assert cpu is not None
        assert os.sched_getaffinity(0) == {cpu}
        assert current_cpu() == cpu
    assert os.sched_getaffinity(0) == before
