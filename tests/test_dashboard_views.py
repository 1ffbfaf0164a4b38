"""The dashboard as a newcomer meets it (issue 26), in one real Chromium over a real server:
every column of the jobs, schedules and models tables on screen at 1280 and 1920 px with long
target and family names and 20 jobs; the submit form offering what the targets run; the pages'
empty states; the 404 page; and ``/docs`` and ``/redoc`` rendering with the network cut.

The browser resolves only ``tunehub.test`` (to the loopback server) and no other name, and
every request a page makes is held and recorded through the DevTools ``Fetch`` domain: one to
anywhere but the server fails, and the tests assert there was none.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient

from tests.test_dashboard import CHROMIUM, DevTools, add_key, enter_key, running_server
from tunehub.core import (
    Budget,
    Config,
    JobSpec,
    JobState,
    MeasureRecord,
    MeasureRequest,
    MeasureResult,
    MeasureStatus,
    ModelInfo,
    Scope,
    Target,
    Workload,
)
from tunehub.db import MemoryScheduleStore, SqlScheduleStore, upgrade
from tunehub.kernels.registry import template_names
from tunehub.service import dashboard
from tunehub.service.app import create_app
from tunehub.service.settings import Settings

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed: run scripts/install-browser.sh (or set TUNEHUB_CHROMIUM)",
)

HOST = "tunehub.test"
WIDTHS = (1280, 1920)

# Long names, as real machines have them: the columns must still all show.
LONG_CPU = Target(
    kind="cpu",
    name="AMD EPYC 9654 96-Core Processor (engineering sample, dual socket, SMT on)",
    arch=("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512cd",
          "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "avx512_vbmi", "amx_tile"),
    cores=192,
    l1d_bytes=32 << 10,
    l2_bytes=1 << 20,
    machine="x86_64",
    toolchain={"cc": "gcc 12.2.0"},
)  # fmt: skip
LONG_GPU = Target(
    kind="cuda",
    name="NVIDIA H100 80GB HBM3 (SXM5, 700 W, MIG disabled, ECC on)",
    arch=("sm_90",),
    cores=132,
    memory_bytes=80 << 30,
    properties={"compute_capability": 90},
    toolchain={"cuda": "12.4", "triton": "3.6.0"},
)
JOBS = 20
GPU_CONFIG: dict[str, int | str | bool] = {
    "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
    "num_stages": 4, "SPLIT_K": 1, "variant": "tma_persistent_warp_specialized",
}  # fmt: skip
CPU_CONFIG: dict[str, int | str | bool] = {
    "MR": 6, "NR": 16, "KC": 256, "MC": 96, "NC": 4096, "threads": 96,
    "parallel_loop": "jc_ic", "b_packed": True, "prefetch": 2,
}  # fmt: skip
METRICS = {"spearman": 0.612, "top1_fraction": 0.91, "top1_geomean": 0.884,
           "time_log2_error": 0.35, "held_out_workloads": 5.0}  # fmt: skip
LONG_REASON = (
    "refused: first pick 5.0% of the best < the default's 63.3%; Spearman 0.024; "
    "time error x28.0 > x4 over 5 held-out workloads of the family"
)


# Jobs of other operators among the 20: their own fields show beside the workload.
BMM_JOB, GROUPED_JOB = 4, 5
GROUP_SIZES = (37, 0, 412, 9, 1024, 77, 301, 5, 666, 130, 2, 845, 64, 19, 250, 88)


def _workload(i: int, gpu: bool) -> Workload:
    if i == BMM_JOB:
        return Workload(op="bmm", m=512, n=512, k=128,
                        params=(("batch", 32), ("b_broadcast", True)))  # fmt: skip
    if i == GROUPED_JOB:
        return Workload(op="grouped_mm", m=sum(GROUP_SIZES), n=14336, k=4096, dtype="float16",
                        params=(("group_sizes", GROUP_SIZES),))  # fmt: skip
    if gpu:
        return Workload(m=16 + i, n=12288, k=49152, dtype="bfloat16", a_layout="col_major",
                        b_layout="col_major", epilogue="bias_gelu")  # fmt: skip
    return Workload(m=1000 + i, n=16384, k=16384, dtype="float64", epilogue="bias_relu")


def _template(workload: Workload, gpu: bool) -> str:
    name = {"matmul": "gemm", "grouped_mm": "grouped_mm"}.get(workload.op, workload.op)
    return f"{'triton' if gpu else 'blis'}.{name}"


def _record(job_id: int | None, workload: Workload, target: Target, secs: float) -> MeasureRecord:
    gpu = target.kind == "cuda"
    template = _template(workload, gpu)
    request = MeasureRequest(
        workload, target, template, 1, Config(GPU_CONFIG if gpu else CPU_CONFIG)
    )
    result = MeasureResult(MeasureStatus.OK, repeat_secs=(secs * 1.01, secs, secs * 0.99))
    return MeasureRecord(request=request, result=result, job_id=job_id)


def _baseline(workload: Workload, target: Target, secs: float) -> MeasureRecord:
    gpu = target.kind == "cuda"
    request = MeasureRequest(
        workload, target, "torch.matmul" if gpu else "numpy.matmul", 1, Config({"threads": 1})
    )
    env = {"blas": "cublas" if gpu else "openblas", "blas_version": "12.4.5" if gpu else "0.3.31"}
    result = MeasureResult(MeasureStatus.OK, repeat_secs=(secs,), environment=env)
    return MeasureRecord(request=request, result=result)


def seed_busy(url: str) -> None:
    """20 jobs over two long-named targets, each with a schedule beside a library time, and
    three models of long-named families (one in use, one refused, one superseded)."""
    upgrade(url)
    store = SqlScheduleStore(url)
    try:
        for target in (LONG_CPU, LONG_GPU):
            store.put_target(target)
        states = [JobState.SUCCEEDED, JobState.RUNNING, JobState.FAILED, JobState.QUEUED]
        for i in range(JOBS):
            gpu = i % 2 == 1
            target = LONG_GPU if gpu else LONG_CPU
            workload = _workload(i, gpu)
            spec = JobSpec(
                workload,
                target.target_key,
                template=_template(workload, gpu),
                strategy="optuna.cmaes",
                budget=Budget(max_trials=100_000, max_secs=21_600.0),
            )
            job = store.create_job(spec)
            store.commit_records([_record(job.id, workload, target, 1.0e-3 * (1 + i % 3))])
            store.commit_baseline(_baseline(workload, target, 2.4e-3))
            state = states[i % len(states)]
            if state is not JobState.QUEUED:
                store.set_job_state(job.id, JobState.RUNNING)
                if state is not JobState.RUNNING:
                    store.set_job_state(job.id, state, error="worker lost" * 20)
        created = datetime(2025, 1, 2, tzinfo=UTC)
        for n, (target, accepted) in enumerate(
            ((LONG_CPU, True), (LONG_CPU, True), (LONG_GPU, False))
        ):
            info = ModelInfo(
                family_key=target.family_key,
                template="triton.gemm" if target.kind == "cuda" else "blis.gemm",
                template_version=1,
                kind="xgboost",
                features="blis.gemm/1",
                records_used=123_456,
                workloads_used=4_321,
                last_record_seq=10_000 + n,
                created_at=created + timedelta(days=n),
                metrics=METRICS,
                target_label=target.label,
                accepted=accepted,
                reason=("accepted: " + LONG_REASON[9:]) if accepted else LONG_REASON,
            )
            store.register_model(info, b"")
    finally:
        store.close()


@pytest.fixture(scope="module")
def busy_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("busy-home")
    seed_busy(f"sqlite:///{home / 'tunehub.db'}")
    settings = Settings(home=home, run_jobs=False, train_models=False, allowed_hosts=[HOST])
    with running_server(settings) as base:
        yield base.replace("127.0.0.1", HOST)


@pytest.fixture(scope="module")
def empty_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A new CPU-only service: no job, no schedule, no model, a GPU target stored once by a
    worker long gone; and a write key for its forms."""
    home = tmp_path_factory.mktemp("empty-home")
    url = f"sqlite:///{home / 'tunehub.db'}"
    upgrade(url)
    key = add_key(url, Scope.WRITE)
    store = SqlScheduleStore(url)
    try:
        store.put_target(LONG_GPU)
    finally:
        store.close()
    settings = Settings(home=home, run_jobs=False, train_models=False, allowed_hosts=[HOST])
    with running_server(settings) as base:
        yield base.replace("127.0.0.1", HOST), key


class Browser:
    """One Chromium for the module that can reach only ``tunehub.test`` (its resolver knows no
    other name, and anything else would go to a proxy on a closed loopback port); the URL of
    every request a page makes is recorded from the DevTools ``Network`` domain."""

    def __init__(self, devtools: DevTools) -> None:
        self.devtools = devtools

    def open(self, url: str, width: int = 1280, height: int = 900) -> str:
        tools = self.devtools
        target = tools.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = tools.call("Target.attachToTarget", {"targetId": target, "flatten": True})
        session: str = attached["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            tools.call(f"{domain}.enable", session=session)
        tools.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        tools.call("Page.navigate", {"url": url}, session=session)
        return session

    @property
    def requests(self) -> list[str]:
        """Every URL the pages asked for, in order."""
        return [
            e["params"]["request"]["url"]
            for e in self.devtools.events
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def outside(self) -> list[str]:
        """The requests that were not for the server."""
        return [u for u in self.requests if not u.startswith(("data:", "blob:"))
                and urlsplit(u).hostname != HOST]  # fmt: skip

    def evaluate(self, session: str, expression: str) -> Any:
        return self.devtools.evaluate(session, expression)

    def wait_for(self, session: str, expression: str, timeout: float = 20.0) -> Any:
        return self.devtools.wait_for(session, expression, timeout)

    def close_tab(self, session: str) -> None:
        self.devtools.call("Page.close", session=session)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    assert CHROMIUM is not None
    profile = tmp_path_factory.mktemp("chromium-profile")
    tools = DevTools(
        CHROMIUM,
        profile,
        extra_flags=(
            f"--host-resolver-rules=MAP {HOST} 127.0.0.1, MAP * ~NOTFOUND",
            "--proxy-server=http://127.0.0.1:9",
            f"--proxy-bypass-list={HOST}",
        ),
    )
    try:
        yield Browser(tools)
    finally:
        tools.close()


def keep_shot(browser: Browser, session: str, name: str) -> None:
    """With ``TUNEHUB_DASHBOARD_SHOTS=<dir>``, a screenshot of the tab there (to look at)."""
    folder = os.environ.get("TUNEHUB_DASHBOARD_SHOTS")
    if folder:
        shot = browser.devtools.call("Page.captureScreenshot", {"format": "png"}, session=session)
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))


# --- every column on screen -------------------------------------------------------------------

# How each page's table shows it has loaded its rows.
TABLES = {
    "/": ("jobs-table", "tr[data-job-id]", JOBS),
    "/schedules": ("schedules-table", "tr[data-workload-key]", JOBS),
    "/models": ("models-table", "tr[data-model-id]", 3),
}

GEOMETRY = """(() => {
  const table = document.getElementById(%s);
  const view = document.documentElement.clientWidth;
  const heads = [...table.querySelectorAll("thead th")].map((th) => {
    const r = th.getBoundingClientRect();
    return {text: th.textContent.trim(), left: r.left, right: r.right,
            cut: th.scrollWidth > th.clientWidth + 1};
  });
  let box = table.parentElement;
  const boxes = [];
  for (; box && box !== document.documentElement; box = box.parentElement) {
    boxes.push({tag: box.tagName, id: box.id, cls: box.className,
                scroll: box.scrollWidth, client: box.clientWidth});
  }
  const cells = [...table.querySelectorAll("tbody td[title]")].map((td) => ({
    title: td.title, text: td.textContent, overflows: td.scrollWidth > td.clientWidth + 1,
  }));
  return {view, page: document.documentElement.scrollWidth, heads, boxes, cells,
          table: table.getBoundingClientRect().right};
})()"""


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("path", list(TABLES))
def test_every_column_header_is_on_screen(
    busy_site: str, browser: Browser, path: str, width: int
) -> None:
    table_id, row, rows = TABLES[path]
    page = browser.open(busy_site + path, width=width)
    try:
        browser.wait_for(
            page, f"document.querySelectorAll('#{table_id} tbody {row}').length === {rows}"
        )
        got = browser.evaluate(page, GEOMETRY % json.dumps(table_id))
        keep_shot(browser, page, f"columns{path.replace('/', '-')}-{width}")
    finally:
        browser.close_tab(page)
    view = got["view"]  # the window less its vertical scrollbar
    assert width - 20 <= view <= width, got
    for head in got["heads"]:
        assert head["left"] >= 0 and head["right"] <= view, (path, width, head)
        assert not head["cut"], f"{path} at {width}: header {head['text']!r} is cut"
    assert got["page"] <= view, f"{path} at {width}: the page scrolls sideways"
    for box in got["boxes"]:
        assert box["scroll"] <= box["client"], f"{path} at {width}: {box} scrolls sideways"
    assert got["table"] <= view
    # What is shortened says all of itself in its tooltip.
    for cell in got["cells"]:
        assert cell["title"], cell
    assert browser.outside() == []


def test_long_target_and_family_names_shorten_with_their_full_name_as_tooltip(
    busy_site: str, browser: Browser
) -> None:
    checks = {
        "/": ("#jobs-table tbody td.target", LONG_GPU.label),
        "/schedules": ("#schedules-table tbody td.target", LONG_GPU.label),
        "/models": ("#models-table tbody .family-name", LONG_GPU.label),
    }
    for path, (selector, label) in checks.items():
        page = browser.open(busy_site + path, width=1280)
        try:
            cells = browser.wait_for(
                page,
                f"(() => {{ const c = [...document.querySelectorAll({json.dumps(selector)})]"
                f".filter((e) => e.title.split('\\n')[0] === {json.dumps(label)});"
                " return c.length ? c.map((e) => ({shown: e.getBoundingClientRect().width,"
                " full: e.scrollWidth})) : null; })()",
            )
        finally:
            browser.close_tab(page)
        assert all(c["full"] > c["shown"] for c in cells), (path, cells)


def test_jobs_and_schedules_show_each_operator_and_its_own_fields_and_filter_by_it(
    busy_site: str, browser: Browser
) -> None:
    cells = (
        "[...document.querySelectorAll('tbody td.operator')].map((td) => ({op: td.dataset.op,"
        " name: td.querySelector('.op-name').textContent, fields: td.querySelector('.op-fields')"
        "?.textContent ?? '', title: td.title}))"
    )
    page = browser.open(busy_site + "/", width=1280)
    try:
        shown = browser.wait_for(
            page, f"(() => {{ const c = {cells}; return c.length ? c : null; }})()"
        )
    finally:
        browser.close_tab(page)
    assert len(shown) == JOBS
    by_op = {c["op"]: c for c in shown}
    assert set(by_op) == {"matmul", "bmm", "grouped_mm"}
    assert by_op["bmm"]["name"] == "bmm" and by_op["bmm"]["fields"] == "batch=32 b_broadcast"
    sizes = ",".join(map(str, GROUP_SIZES))
    assert by_op["grouped_mm"]["fields"] == f"group_sizes={sizes}"
    assert by_op["grouped_mm"]["title"] == f"grouped_mm: group_sizes={sizes}"
    assert by_op["matmul"]["fields"] == "" and by_op["matmul"]["title"] == "matmul"

    # The schedules page filters by operator, from its URL and from its form.
    page = browser.open(busy_site + "/schedules?op=grouped_mm", width=1280)
    try:
        rows = browser.wait_for(
            page,
            "(() => { const r = [...document.querySelectorAll('#schedules-table tbody "
            "tr[data-workload-key]')]; return r.length ? r.map((tr) => tr.dataset.op) : null; })()",
        )
        options = browser.evaluate(
            page, "[...document.querySelectorAll('select[name=op] option')].map((o) => o.value)"
        )
        chosen = browser.evaluate(page, "document.querySelector('select[name=op]').value")
        browser.evaluate(
            page,
            "(() => { const f = document.getElementById('schedules-filter');"
            " f.elements.op.value = 'bmm'; f.requestSubmit(); })()",
        )
        after = browser.wait_for(
            page,
            "(() => { const r = [...document.querySelectorAll('#schedules-table tbody "
            "tr[data-workload-key]')].map((tr) => tr.dataset.op);"
            " return r.length && r.every((op) => op === 'bmm') ? [r, location.search] : null; })()",
        )
    finally:
        browser.close_tab(page)
    assert rows == ["grouped_mm"] and chosen == "grouped_mm"
    assert {"", "matmul", "bmm", "grouped_mm", "attention"} <= set(options)
    assert after == [["bmm"], "?op=bmm"]
    assert browser.outside() == []


# --- empty states that teach (before the tests below add jobs to the empty site) ----------


def test_empty_pages_say_how_to_begin(empty_site: tuple[str, str], browser: Browser) -> None:
    base, _ = empty_site
    page = browser.open(base + "/")
    try:
        text = browser.wait_for(
            page, "document.querySelector('#jobs-table .empty-row')?.textContent"
        )
        keep_shot(browser, page, "no-jobs")
    finally:
        browser.close_tab(page)
    assert "No tuning jobs yet" in text and "tunehub tune 256 256 256" in text
    assert f"curl -X POST {base}/api/v1/jobs" in text and "X-API-Key" in text

    page = browser.open(base + "/models")
    try:
        text = browser.wait_for(
            page, "document.querySelector('#models-table .empty-row')?.textContent"
        )
    finally:
        browser.close_tab(page)
    assert "No model yet" in text and "TUNEHUB_TRAIN_MIN_NEW_RECORDS" in text


# --- the submit form offers what the service runs -----------------------------------------------


def test_the_targets_api_says_what_each_target_runs(tmp_path: Path) -> None:
    store = MemoryScheduleStore()
    store.put_target(LONG_GPU)
    app = create_app(Settings(home=tmp_path, run_jobs=False), store=store)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        answer = client.get("/api/v1/targets").json()
    by_kind = {t["kind"]: {p["name"]: p for p in t["templates"]} for t in answer["items"]}
    assert not {"numpy.matmul", "torch.matmul"} & {*by_kind["cpu"], *by_kind["cuda"]}, (
        "baselines are measured, never tuned: no job names them"
    )
    assert "triton.gemm" not in by_kind["cpu"] and "blis.gemm" not in by_kind["cuda"]
    cpu = by_kind["cpu"]["blis.gemm"]
    assert cpu["ops"] == ["matmul"] and cpu["dtypes"] == ["float32", "float64"]
    assert cpu["epilogues"] == ["none", "bias", "bias_relu"] and cpu["allow_tf32"] is False
    assert cpu["a_layouts"] == cpu["b_layouts"] == ["row_major"]
    gpu = by_kind["cuda"]["triton.gemm"]
    assert "float8_e4m3" in gpu["dtypes"] and "bias_gelu" in gpu["epilogues"]
    assert gpu["allow_tf32"] is True and "col_major" in gpu["b_layouts"]
    assert {"transfer", "random", "optuna.tpe"} <= set(answer["strategies"])
    assert answer["default_strategy"] == "transfer"


OPTIONS = (
    "(() => {{ const s = document.querySelector('#submit-form [name={0}]');"
    " return s && s.options.length ? [...s.options].map((o) => o.value) : null; }})()"
)


def test_the_submit_form_offers_only_what_the_targets_run(
    empty_site: tuple[str, str], browser: Browser
) -> None:
    """A CPU-only service (a GPU target stored, but no worker and no local alias for it): the
    form offers this machine's CPU with its dtypes and epilogues, never the GPU's, says the
    other target has no live worker, and submits the epilogue and strategy chosen."""
    base, key = empty_site
    page = browser.open(base + "/")
    try:
        browser.wait_for(page, "document.getElementById('key-state')?.dataset.key")
        enter_key(browser.devtools, page, key)
        assert browser.wait_for(page, OPTIONS.format("dtype")) == ["float32", "float64"]
        templates = browser.evaluate(page, OPTIONS.format("template"))
        # blis.gemm, the CPU's default, first; besides it only the CPU test templates that other
        # test modules of this process registered (they run here), never a GPU template.
        assert templates[0] == "blis.gemm", templates
        assert set(templates[1:]) <= {n for n in template_names() if n.startswith("test.")}
        assert browser.evaluate(page, OPTIONS.format("epilogue")) == ["none", "bias", "bias_relu"]
        strategies = browser.evaluate(page, OPTIONS.format("strategy"))
        assert "transfer" in strategies and "optuna.tpe" in strategies
        chosen = "document.querySelector('#submit-form [name=strategy]').value"
        assert browser.evaluate(page, chosen) == "transfer", "the default is chosen"
        targets = browser.evaluate(page, OPTIONS.format("target"))
        assert targets == ["local-cpu"], "only what this service runs"
        keep_shot(browser, page, "submit-form")
        note = browser.evaluate(page, "document.getElementById('submit-note').textContent")
        assert "1 other stored target has no live worker" in note
        assert browser.evaluate(page, "document.getElementById('tf32-field').hidden") is True
        set_field = "document.querySelector('#submit-form [name={}]').value = '{}'"
        for name, value in (("m", "48"), ("n", "40"), ("k", "32"), ("epilogue", "bias_relu"),
                            ("strategy", "random"), ("dtype", "float64")):  # fmt: skip
            browser.evaluate(page, set_field.format(name, value))
        browser.evaluate(page, "document.getElementById('submit-form').requestSubmit()")
        path = browser.wait_for(page, "location.pathname.startsWith('/jobs/') && location.pathname")
    finally:
        browser.close_tab(page)
    assert browser.outside() == []
    job_id = int(path.rsplit("/", 1)[1])
    # the job stored is the one asked for
    import urllib.request

    with urllib.request.urlopen(
        urllib.request.Request(
            f"{base.replace(HOST, '127.0.0.1')}/api/v1/jobs/{job_id}", headers={"Host": HOST}
        ),
        timeout=10,
    ) as answer:
        job = json.load(answer)
    assert job["workload"]["epilogue"] == "bias_relu" and job["workload"]["dtype"] == "float64"
    assert job["strategy"] == "random" and job["template"] == "blis.gemm"


def test_a_job_page_before_any_model_says_why_there_is_no_prediction_chart(
    empty_site: tuple[str, str], browser: Browser
) -> None:
    base, key = empty_site
    import urllib.request

    request = urllib.request.Request(
        f"{base.replace(HOST, '127.0.0.1')}/api/v1/jobs",
        data=json.dumps({"workload": {"m": 8, "n": 8, "k": 8}}).encode(),
        headers={"Host": HOST, "Content-Type": "application/json", "X-API-Key": key},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        job_id = json.load(answer)["id"]
    page = browser.open(f"{base}/jobs/{job_id}")
    try:
        text = browser.wait_for(
            page,
            "(() => { const p = document.getElementById('prediction-panel');"
            " return p && !p.hidden && p.dataset.state === 'no-model' && p.textContent; })()",
        )
    finally:
        browser.close_tab(page)
    assert "No cost model" in text and "TUNEHUB_TRAIN_MIN_NEW_RECORDS" in text
    assert "/models" in text or "Models" in text


# --- the 404 page -------------------------------------------------------------------------------


def test_unknown_dashboard_paths_get_a_page_and_the_api_keeps_json(
    busy_site: str, browser: Browser
) -> None:
    page = browser.open(busy_site + "/no/such/page?x=<b>")
    try:
        home = browser.wait_for(page, "document.getElementById('home-link')?.href")
        said = browser.evaluate(page, "document.getElementById('not-found-path').textContent")
        title = browser.evaluate(page, "document.title")
        keep_shot(browser, page, "not-found")
    finally:
        browser.close_tab(page)
    assert home == busy_site + "/" and said == "/no/such/page" and "Not found" in title

    app = create_app(Settings(run_jobs=False), store=MemoryScheduleStore())
    with TestClient(app, base_url="http://127.0.0.1") as client:
        html = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
        answer = client.get("/jobs/1/oops", headers=html)
        assert answer.status_code == 404 and answer.headers["content-type"].startswith("text/html")
        assert 'href="/"' in answer.text
        escaped = client.get("/<script>x</script>", headers=html)
        assert "<script>x" not in escaped.text and "&lt;script&gt;x" in escaped.text
        for path in ("/api/v1/nope", "/api/v1/jobs/999", "/static/nope.js", "/openapi.json/x"):
            answer = client.get(path, headers=html)
            assert answer.status_code == 404, path
            assert answer.headers["content-type"] == "application/json", path
            assert "detail" in answer.json()
        plain = client.get("/no/such/page", headers={"Accept": "application/json"})
        assert plain.status_code == 404 and plain.json() == {"detail": "Not Found"}


# --- the API's documentation with no network ---------------------------------------------


def test_docs_pages_render_with_the_network_cut(busy_site: str, browser: Browser) -> None:
    errors = len(browser.devtools.page_errors())
    before = len(browser.requests)
    page = browser.open(busy_site + "/docs", width=1280)
    try:
        operations = browser.wait_for(
            page,
            "(() => { const ops = document.querySelectorAll('.opblock .opblock-summary-path');"
            " return ops.length > 10 ? [...ops].map((o) => o.textContent) : null; })()",
        )
        title = browser.evaluate(page, "document.querySelector('.info .title')?.textContent")
    finally:
        browser.close_tab(page)
    assert any("/api/v1/jobs" in op for op in operations), operations
    assert "tunehub" in title
    docs_requests = browser.requests[before:]
    assert busy_site + "/openapi.json" in docs_requests
    assert busy_site + "/docs/assets/swagger-ui-bundle.js" in docs_requests

    before = len(browser.requests)
    page = browser.open(busy_site + "/redoc", width=1280)
    try:
        browser.wait_for(
            page,
            "(() => { const t = document.querySelector('h1')?.textContent ?? '';"
            " return t.includes('tunehub') &&"
            " document.body.textContent.includes('List jobs'); })()",
        )
    finally:
        browser.close_tab(page)
    assert busy_site + "/docs/assets/redoc.standalone.js" in browser.requests[before:]
    assert browser.outside() == [], "a docs page reached past the service"
    # nothing failed, and the pages' content-security policy refused nothing (it allows only
    # this service)
    assert browser.devtools.page_errors()[errors:] == []


def test_docs_assets_come_from_the_installed_package() -> None:
    folder = dashboard.docs_assets_dir()
    names = {p.name for p in folder.iterdir()}
    assert {"swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js"} <= names
    assert "site-packages" in str(folder) or "dist-packages" in str(folder)
    app = create_app(Settings(run_jobs=False), store=MemoryScheduleStore())
    with TestClient(app, base_url="http://127.0.0.1") as client:
        docs = client.get("/docs").text
        assert "cdn." not in docs and "https://" not in docs
        redoc = client.get("/redoc").text
        assert "fonts.googleapis" not in redoc and "https://" not in redoc
        js = client.get("/docs/assets/swagger-ui-bundle.js")
        assert js.status_code == 200
        assert js.content == (folder / "swagger-ui-bundle.js").read_bytes()
        # ReDoc's bundle shows Redocly's logo from their CDN: served with an image of its own.
        installed = (folder / "redoc.standalone.js").read_bytes()
        assert dashboard.REDOC_CDN_LOGO.encode() in installed
        redoc_js = client.get("/docs/assets/redoc.standalone.js")
        assert redoc_js.status_code == 200
        assert b"cdn.redoc.ly" not in redoc_js.content
        assert len(redoc_js.content) > len(installed) // 2
