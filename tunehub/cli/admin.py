"""``tunehub db`` (the schema) and ``tunehub keys`` (API keys)."""

from __future__ import annotations

import click

from tunehub.cli.common import (
    data_home,
    database_problem,
    database_state,
    fail,
    load_settings,
    open_store,
    store_url,
)
from tunehub.core import InvalidSpec
from tunehub.core.job import MAX_SECS, MAX_TRIALS


@click.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
def db_upgrade_cmd() -> None:
    """Create the database or migrate it to the current schema."""
    from tunehub.db import current_revision, head_revision
    from tunehub.db import upgrade as db_upgrade
    from tunehub.db.engine import safe_url

    settings = load_settings()
    data_home(settings)
    url = settings.resolved_database_url()
    try:
        before = current_revision(url)
        if before is None and database_state(url) == "foreign":
            fail(database_problem(url, RuntimeError("tables but no revision")))
        db_upgrade(url)
    except click.ClickException:
        raise
    except Exception as exc:
        fail(database_problem(url, exc))
    click.echo(f"database {safe_url(url)}: {before or 'empty'} -> {head_revision()} (head)")


@db.command("current")
def db_current_cmd() -> None:
    """Print the database's schema revision and the head revision."""
    from tunehub.db import current_revision, head_revision
    from tunehub.db.engine import safe_url

    url = store_url()
    try:
        current = current_revision(url)
    except Exception as exc:
        fail(database_problem(url, exc))
    click.echo(f"database {safe_url(url)}: {current or 'empty'}; head {head_revision()}")


@click.group()
def keys() -> None:
    """API keys: writes over HTTP need one (reads too, if TUNEHUB_READ_REQUIRES_KEY is set).

    Keys are stored hashed: a key is shown once, when it is made.
    """


@keys.command("create")
@click.option(
    "--scope",
    type=click.Choice(["read", "write", "admin"]),
    default="write",
    show_default=True,
    help="read: closed reads; write: submit jobs and cancel its own; admin: everything.",
)
@click.option("--name", default=None, help="Who or what it is for (default: the scope).")
@click.option(
    "--max-trials",
    type=click.IntRange(1, MAX_TRIALS),
    default=None,
    help="Most trials per job for this key (default TUNEHUB_MAX_JOB_TRIALS).",
)
@click.option(
    "--max-secs",
    type=click.FloatRange(1, MAX_SECS),
    default=None,
    help="Most tuning seconds per job (default TUNEHUB_MAX_JOB_SECS).",
)
@click.option("--max-queued-jobs", type=click.IntRange(1, 100_000), default=None,
              help="Jobs it may have queued or running (default "
              "TUNEHUB_MAX_QUEUED_JOBS_PER_KEY).")  # fmt: skip
def keys_create(
    scope: str,
    name: str | None,
    max_trials: int | None,
    max_secs: float | None,
    max_queued_jobs: int | None,
) -> None:
    """Make a key and print it (only now: it is stored hashed)."""
    from tunehub.core import KeyLimits, Scope
    from tunehub.core.apikey import check_key_name, new_api_key

    name = name or f"{scope} key"
    try:
        check_key_name(name)
    except InvalidSpec as exc:
        raise click.BadParameter(exc.reason, param_hint="--name") from None
    store = open_store(store_url(), init=True)
    try:
        for _ in range(5):  # a clash of the random 8-digit prefixes is rare; draw again
            token, prefix, digest = new_api_key()
            try:
                key = store.create_api_key(
                    prefix=prefix,
                    secret_hash=digest,
                    name=name,
                    scope=Scope(scope),
                    limits=KeyLimits(max_trials, max_secs, max_queued_jobs),
                )
                break
            except ValueError:
                continue
        else:
            fail("could not draw an unused key prefix; try again")
    finally:
        store.close()
    click.echo(token)
    click.echo(
        f"API key {key.id} ({name}, scope {scope}) made; this is the only time it is shown. "
        "Send it in the X-API-Key header.",
        err=True,
    )


@keys.command("list")
def keys_list() -> None:
    """Every key: id, prefix, scope, name, when made, revoked or not, its own limits."""
    store = open_store(store_url(), init=False)
    try:
        found = store.list_api_keys()
    finally:
        store.close()
    if not found:
        click.echo("no API keys yet: `tunehub keys create --scope write`")
        return
    click.echo(f"{'id':>4}  {'key':<12} {'scope':<6} {'state':<8} {'created (UTC)':<17} name")
    for key in found:
        state = "active" if key.active else "revoked"
        limits = [
            f"{label} {value:g}"
            for label, value in (
                ("trials", key.limits.max_trials),
                ("secs", key.limits.max_secs),
                ("queued", key.limits.max_queued_jobs),
            )
            if value is not None
        ]
        extra = f"  [{', '.join(limits)}]" if limits else ""
        created = key.created_at.strftime("%Y-%m-%d %H:%M")
        click.echo(
            f"{key.id:>4}  th_{key.prefix:<9} {key.scope.value:<6} {state:<8} {created:<17} "
            f"{key.name}{extra}"
        )


@keys.command("revoke")
@click.argument("key")
def keys_revoke(key: str) -> None:
    """Revoke KEY (its id, its th_xxxxxxxx prefix, or the key itself): it stops working at
    once. Its jobs run on."""
    from tunehub.core.apikey import parse_api_key
    from tunehub.db import ApiKeyNotFound

    store = open_store(store_url(), init=False)
    try:
        if key.isdigit():
            found = store.get_api_key(key_id=int(key))
        else:
            prefix = parse_api_key(key) or key.removeprefix("th_")
            found = store.get_api_key(prefix=prefix) if len(prefix) == 8 else None
        if found is None:
            raise ApiKeyNotFound(key)
        revoked = store.revoke_api_key(found.id)
    except ApiKeyNotFound:
        fail(f"no API key {key!r}; `tunehub keys list` shows them")
    finally:
        store.close()
    click.echo(f"API key {revoked.id} ({revoked.label}) revoked")
