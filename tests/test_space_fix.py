"""SearchSpace.fix: pinning knobs (e.g. threads=1 for a single-threaded build)."""

from __future__ import annotations

import pytest

from tunehub.core import Workload, local_cpu_target
from tunehub.kernels.registry import get_template
from tunehub.kernels.space import Knob, SearchSpace


def test_fix_keeps_constraints_and_only_the_pinned_value() -> None:
    space = SearchSpace(
        (Knob("MR", (2, 4, 8)), Knob("threads", (1, 2))),
        (lambda c: not (c["MR"] == 8 and c["threads"] == 2),),
    )
    fixed = space.fix(threads=2)
    assert [c["MR"] for c in fixed.points] == [2, 4]
    assert all(space.is_valid(c) for c in fixed.points)


def test_fix_refuses_unknown_knobs_and_values() -> None:
    space = SearchSpace((Knob("MR", (2, 4)),))
    with pytest.raises(ValueError, match="not in"):
        space.fix(MR=3)
    with pytest.raises(ValueError, match="no knobs named"):
        space.fix(NR=8)


def test_fixing_threads_of_blis_gemm_gives_single_threaded_points() -> None:
    target = local_cpu_target()
    space = get_template("blis.gemm").space(Workload(m=64, n=64, k=64), target)
    single = space.fix(threads=1)
    assert len(single) > 0
    assert {c["threads"] for c in single.points} == {1}
