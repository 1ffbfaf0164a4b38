"""benchmarks/operators.py: its suites are valid workloads of the registered operators, its
templates come from the registries, its summary and merge, and a tiny CPU run end to end
(its own ``tunehub serve``, a lookup per shape, the side-by-side timing, the JSON)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tunehub.core import Target
from tunehub.core.operators import operator_names

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "operators.py"
sys.path.insert(0, str(REPO / "benchmarks"))
import operators as bench  # noqa: E402

CPU = Target(kind="cpu", name="x", arch=("avx2", "fma"), cores=2, l1d_bytes=32768,
             l2_bytes=1 << 20, machine="x86_64")  # fmt: skip


def test_every_suite_shape_is_a_valid_workload_of_its_registered_operator() -> None:
    assert bench.check_suites() == []
    # conv2d's suite waits for its operator; the others are registered now.
    assert {"bmm", "grouped_mm", "attention"} <= set(operator_names()) & set(bench.SUITES)
    small = [s.name for s in bench.shapes_for("bmm", "cpu", "small")]
    assert "llama-scores-512" in small and "tiny" not in small
    full_gpu = bench.shapes_for("bmm", "cuda", "full")
    assert len(full_gpu) > len(small) and all(s.size != "tiny" for s in full_gpu)
    assert [s.name for s in bench.shapes_for("attention", "cpu", "full")] == []


def test_uneven_groups_sum_to_the_rows_and_leave_one_expert_nearly_empty() -> None:
    sizes = bench._uneven(1024, 8, 512)
    assert sum(sizes) == 1024 and len(sizes) == 8
    assert min(sizes) < 10 and max(sizes) > 1024 / 8
    assert (
        bench.query_dict({"op": "grouped_mm", "group_sizes": [3, 0, 5]})["group_sizes"] == "3,0,5"
    )


def test_templates_come_from_the_registries() -> None:
    picked = bench.pick_templates("bmm", CPU)
    assert not isinstance(picked, str)
    assert (picked[0].name, picked[1].name) == ("blis.bmm", "torch.bmm")
    assert "no template runs attention on cpu" in str(bench.pick_templates("attention", CPU))
    assert "not registered" in str(bench.pick_templates("conv3d", CPU))


def case(op: str, vs: float, served: str, over: float) -> dict[str, Any]:
    return {"op": op, "name": f"{op}-{vs}", "template": "t", "vendor": "v", "vs_vendor": vs,
            "served": served, "served_over_best": over}  # fmt: skip


def test_summary_per_operator_and_merge_of_steps(tmp_path: Path) -> None:
    cases = [case("bmm", 2.0, "tuned", 1.0), case("bmm", 0.5, "vendor", 1.0),
             {"op": "bmm", "name": "broken", "error": "x"},
             case("attention", 0.9, "vendor", 1.0)]  # fmt: skip
    summary = bench.summarize(cases)
    assert summary["bmm"]["geomean_vs_vendor"] == pytest.approx(1.0)
    assert summary["bmm"]["min_vs_vendor"] == 0.5
    assert summary["bmm"]["served_over_best"] == pytest.approx(1.0)
    assert (summary["bmm"]["cases"], summary["bmm"]["errors"], summary["bmm"]["served_vendor"]) == (
        2, 1, 1)  # fmt: skip
    assert "Inductor" in summary["bmm"]["compared"]
    runs = [{"device_kind": "cuda", "machine": {"gpu": "H100"}, "cases": cases[:2],
             "skipped": {"attention": "later"}},
            {"device_kind": "cuda", "machine": {"gpu": "H100"}, "cases": cases[3:]}]  # fmt: skip
    merged = bench.merge(runs, [tmp_path / "a.json", tmp_path / "b.json"])
    assert set(merged["summary"]) == {"bmm", "attention"} and merged["skipped"] == {}
    # A later step's run of a case replaces the earlier one's.
    rerun = {**cases[1], "vs_vendor": 2.0, "served": "tuned"}
    runs.append({"device_kind": "cuda", "machine": {"gpu": "H100"}, "cases": [rerun]})
    merged = bench.merge(runs, [tmp_path / f"{n}.json" for n in "abc"])
    assert len(merged["cases"]) == 3 and merged["summary"]["bmm"]["min_vs_vendor"] == 2.0
    assert merged["replaced"] == [{"name": "bmm-0.5", "file": "a.json", "by": "c.json"}]
    with pytest.raises(SystemExit, match="different machines"):
        bench.merge([runs[0], {**runs[1], "machine": {"gpu": "H200"}}], [tmp_path] * 2)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_a_tiny_cpu_run_looks_up_times_side_by_side_and_writes_the_json(tmp_path: Path) -> None:
    # --skip-tune: the lookup answers with the template's default (tuning through the
    # service is compile_models' machinery, tested in test_compiler_benchmarks).
    out = tmp_path / "ops.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TUNEHUB_GPUS": "none",
           "TUNEHUB_MIN_REPEAT_SECS": "0.02"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu", "--shapes", "tiny", "--skip-tune", "--rounds",
         "2", "--min-secs", "0.02", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device_kind"] == "cpu" and result["machine"]["cpu"]
    assert result["skipped"]["attention"].startswith("no template runs attention on cpu")
    (bmm,) = [c for c in result["cases"] if c["op"] == "bmm"]
    assert bmm["lookup"]["source"] == "default" and bmm["template"] == "blis.bmm"
    # Nothing confirmed or measured for a default: the fields say so rather than go missing.
    assert bmm["lookup"]["confirmed_spread"] is None and "baseline_secs" in bmm["lookup"]
    assert len(bmm["rounds"]["tuned"]) == 2 and bmm["vendor"] == "torch.bmm"
    vendors = [label for label in bmm["medians"] if label.startswith("vendor ")]
    assert vendors == ["vendor threads=1", "vendor threads=2"]
    assert bmm["vs_vendor"] == pytest.approx(bmm["vendor_secs"] / bmm["tuned_secs"])
    assert bmm["vendor_secs"] == min(bmm["medians"][v] for v in vendors)
    assert bmm["served"] == "tuned" and bmm["served_over_best"] == pytest.approx(bmm["vs_vendor"])
    assert result["summary"]["bmm"]["cases"] == 1
    assert "geomean vs vendor" in done.stdout
