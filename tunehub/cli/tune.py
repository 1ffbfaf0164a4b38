"""``tunehub tune``: tune a workload on this machine, without a server."""

from __future__ import annotations

import json
import time

import click

from tunehub.cli.common import (
    NumbersCommand,
    data_home,
    fail,
    load_settings,
    make_workload,
    open_store,
    param_hint,
    workload_options,
)
from tunehub.cli.progress import DEFAULT_EVERY_SECS, trial_progress
from tunehub.core import Budget, Target
from tunehub.core.job import DEFAULT_STRATEGY, MAX_SECS, MAX_TRIALS


def local_kind_target(kind: str) -> Target:
    """A stand-in target of ``kind`` to read templates' capabilities by (their ops)."""
    return Target(kind=kind, name="any", arch=(), cores=1)


@click.command(cls=NumbersCommand)
@click.argument("m", type=int, required=False, metavar="M")
@click.argument("n", type=int, required=False, metavar="N")
@click.argument("k", type=int, required=False, metavar="K")
@workload_options
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="Where to tune: cpu, or cuda:N for this host's GPU N.",
)
@click.option(
    "--template",
    default=None,
    help="Default: the operator's template for the device (blis.gemm / blis.bmm on cpu, "
    "triton.gemm on GPUs).",
)
@click.option("--strategy", default=DEFAULT_STRATEGY, show_default=True)
@click.option("--trials", type=click.IntRange(1, MAX_TRIALS), default=32, show_default=True)
@click.option(
    "--secs",
    type=click.FloatRange(1, MAX_SECS),
    default=300.0,
    show_default=True,
    help="Tuning time budget (the baseline and the final confirmation are not counted).",
)
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option(
    "--progress-every",
    type=click.FloatRange(0, 3600),
    default=DEFAULT_EVERY_SECS,
    show_default=True,
    metavar="SECS",
    help="Where stderr is not a terminal (a pipe, a log): a progress line at most every SECS "
    "seconds, and the last one. A terminal shows a live bar instead.",
)
def tune(
    m: int | None,
    n: int | None,
    k: int | None,
    dtype: str,
    epilogue: str,
    a_layout: str,
    b_layout: str,
    allow_tf32: bool,
    op: str,
    fields: tuple[str, ...],
    device: str,
    template: str | None,
    strategy: str,
    trials: int,
    secs: float,
    seed: int,
    as_json: bool,
    progress_every: float,
) -> None:
    """Tune an MxNxK GEMM on this machine (its CPU, or a GPU), without a server; another
    operator with --op and its own fields with --field (``tunehub tune --op bmm --field
    batch=16 128 128 64``).

    Measurements and the best schedule go to the local database, as a job that shows on the
    dashboard. The winner is re-timed against the runners-up, then compared with the vendor
    library (OpenBLAS through numpy on the CPU) timed the same way with the same thread
    count, and the output says which is faster.
    """
    from tunehub.core import JobSpec, JobState
    from tunehub.core.owner import new_owner
    from tunehub.core.registry import UnknownName
    from tunehub.kernels.base import TimingPolicy
    from tunehub.kernels.registry import get_template, template_names
    from tunehub.tuner import (
        LeaseKeeper,
        baseline_dict,
        find_schedule,
        session_for_job,
    )
    from tunehub.tuner import strategy_names as known_strategies
    from tunehub.tuner.best import best_dict, best_line
    from tunehub.tuner.lookup import config_threads
    from tunehub.workers.local import LocalMeasurer

    workload = make_workload(
        m, n, k, dtype, epilogue, a_layout, b_layout, allow_tf32, op=op, fields=fields
    )
    if device != "cpu" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise click.BadParameter("use cpu or cuda:N", param_hint="--device")
    if strategy not in known_strategies():
        raise click.BadParameter(
            f"unknown strategy {strategy!r}; known: {', '.join(known_strategies())}",
            param_hint="--strategy",
        )
    if template is None:
        # The first template, by name, that computes the operator on this kind of device.
        kind = "cpu" if device == "cpu" else "cuda"
        template = next(
            (
                name
                for name in template_names()
                if not get_template(name).baseline
                and get_template(name).device_kind == kind
                and workload.op in get_template(name).capabilities(local_kind_target(kind)).ops
            ),
            "blis.gemm" if device == "cpu" else "triton.gemm",
        )
    try:
        tmpl = get_template(template)
    except UnknownName as exc:
        raise click.BadParameter(str(exc), param_hint="--template") from None
    settings = load_settings()
    data_home(settings)
    measurer = LocalMeasurer(
        device=device,
        build_dir=settings.build_dir,
        timing=TimingPolicy(min_secs=settings.min_repeat_secs, max_repeats=settings.max_repeats),
        timeout_secs=settings.measure_timeout_secs,
        max_candidate_secs=settings.max_candidate_secs,
        build_timeout_secs=settings.build_timeout_secs,
        builders=settings.builders,
        build_cache_max_bytes=settings.build_cache_max_bytes,
    )
    try:
        target = measurer.target
    except RuntimeError as exc:
        measurer.close()
        fail(str(exc))
    problem = tmpl.problem(workload, target)
    if problem is not None:
        measurer.close()
        raise click.BadParameter(problem.reason, param_hint=param_hint(problem.field))
    store = open_store(settings.resolved_database_url(), init=True)
    store.put_target(target)
    spec = JobSpec(
        workload=workload,
        target_key=target.target_key,
        template=tmpl.name,
        strategy=strategy,
        budget=Budget(max_trials=trials, max_secs=secs),
        seed=seed,
    )
    owner = new_owner()
    job = store.create_job(spec, claimed=True, owner=owner, lease_secs=settings.lease_secs)
    # The lease keeps serve's runners off this job while it runs here; were this process to
    # die, the job would go back to their queue once the lease expired.
    leases = LeaseKeeper(store, lease_secs=settings.lease_secs, reap=False)
    leases.hold(job.id, owner)
    leases.start()
    click.echo(
        f"job {job.id}: tuning {workload.label} with {tmpl.name} on {target.label}: "
        f"{len(tmpl.space(workload, target))} configs, {strategy}, "
        f"budget {trials} trials / {secs:.0f}s, {measurer.builders} build process(es)",
        err=True,
    )

    def finish(state: JobState, error: str) -> None:
        # Only from RUNNING and only while ours: a cancel from the dashboard or the API stands.
        leases.stop()
        store.set_job_state(job.id, state, error=error, only_from=(JobState.RUNNING,), owner=owner)

    last_check = [0.0, False]

    def cancelled() -> bool:
        if leases.lost(job.id):
            return True
        if not last_check[1] and time.monotonic() - float(last_check[0]) > 0.25:
            last_check[0] = time.monotonic()
            last_check[1] = store.get_job(job.id).state is JobState.CANCELLED
        return bool(last_check[1])

    with trial_progress(trials, every_secs=progress_every) as progress:
        try:
            result = session_for_job(
                spec,
                store=store,
                measurer=measurer,
                target=target,
                job_id=job.id,
                on_progress=progress,
                should_stop=cancelled,
                owner=owner,
                db_outage_secs=settings.db_outage_secs,
            ).run()
        except BaseException as exc:
            finish(JobState.FAILED, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            measurer.close()
            leases.stop()
    if result.stopped_by == "lease_lost" or leases.lost(job.id):
        fail(
            f"job {job.id} lost its lease (this process was stalled, or the database away, for "
            f"longer than TUNEHUB_LEASE_SECS={settings.lease_secs:g}); a runner of "
            "`tunehub serve` resumes it"
        )
    if result.stopped_by == "cancelled":
        fail(f"job {job.id} was cancelled after {result.trials_done} trials")
    if result.stopped_by in ("worker_error", "noisy"):  # the machine failed, or was too busy
        finish(JobState.FAILED, result.error)
        fail(f"job {job.id} failed: {result.error}")
    best = result.best
    if best is None:
        if result.trials_done == 0:
            finish(JobState.SUCCEEDED, "")
            fail(
                f"every config of {tmpl.name} for {workload.label} was measured before; "
                f"see `tunehub lookup {m} {n} {k}`"
            )
        finish(JobState.FAILED, "no candidate measured ok")
        fail(f"no candidate measured ok in {result.trials_done} trials; see `tunehub jobs`")
    finish(JobState.SUCCEEDED, "")
    # One best: what the lookup now serves for this workload (the confirmed winner, which can
    # be another config than the fastest single trial), as the job list and the API show it.
    answer = find_schedule(store, workload, target, template=tmpl.name)
    store.close()
    if answer is None:  # an ok record was stored, so a schedule exists; unless it was deleted
        fail(f"job {job.id}: no schedule stored for {workload.label}; see `tunehub jobs`")
    served = best_dict(answer)
    schedule = answer.schedule
    confirmation = schedule.confirmation
    out = {
        "job": job.id,
        "workload": workload.label,
        "template": tmpl.name,
        "target": target.label,
        "trials": result.trials_done,
        "stopped_by": result.stopped_by,
        "config": schedule.config.to_dict(),
        "median_secs": answer.best_secs,
        "gflops": served["gflops"],
        "confirmed": confirmation is not None,
        "confirmed_spread": confirmation.spread if confirmation else None,
        "baseline": baseline_dict(answer.baseline),
        "speedup_vs_baseline": answer.speedup_vs_baseline,
        "best": served,
    }
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    how = (
        f"confirmed over {confirmation.rounds} rounds, spread {100 * confirmation.spread:.1f}%"
        if confirmation
        else "not confirmed"
    )
    click.echo(f"job {job.id}: {result.trials_done} trials ({result.stopped_by}); {how}")
    click.echo(best_line(served, workload.label, target.label))
    baseline, speedup = answer.baseline, answer.speedup_vs_baseline
    if baseline is not None and baseline.gflops is not None and speedup is not None:
        # The lookup's rule: a tie (within LIBRARY_TIE, or the rounds' spread) goes to it.
        verdict = (
            "tunehub is faster"
            if not answer.baseline_faster
            else "a tie: use the library"
            if speedup >= 1
            else "the library is faster: use it"
        )
        library = baseline_dict(baseline) or {}
        on = (
            f"on {config_threads(schedule.config)} thread(s)"
            if target.kind == "cpu"
            else f"({library.get('library', 'vendor library')})"
        )
        click.echo(
            f"vs {baseline.request.template} {on}: {baseline.gflops:.2f} GFLOP/s, "
            f"speedup {speedup:.2f}x ({verdict})"
        )
