"""What every command shares: settings, the data dir, the store, a workload's options, and
one-line errors (``fail``) that say what is wrong and what to do."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from difflib import get_close_matches
from typing import Any, NoReturn

import click

from tunehub.core import InvalidSpec, Workload
from tunehub.core.operators import ParamValue
from tunehub.core.workload import COMMON_FIELDS, DTYPES, EPILOGUES, LAYOUTS

NEGATIVE = re.compile(r"-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?", re.IGNORECASE)


def load_settings() -> Any:
    """The service's settings; a malformed TUNEHUB_* variable is a one-line error."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from tunehub.service.settings import Settings

    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        name = "TUNEHUB_" + ".".join(str(p) for p in first["loc"]).upper()
        fail(f"{name}: {first['msg']} (got {str(first.get('input'))[:80]!r})")
    except SettingsError as exc:
        fail(f"settings: {exc}")


def fail(message: str) -> NoReturn:
    raise click.ClickException(message)


def data_home(settings: Any) -> Any:
    """The data dir, created if missing; a one-line error when it cannot be made or written."""
    from tunehub.kernels.build import dir_problem

    problem = dir_problem(settings.home)
    if problem is not None:
        fail(
            f"TUNEHUB_HOME: {problem}; make it writable or point TUNEHUB_HOME at a "
            "writable directory"
        )
    return settings.home


def make_workload(
    m: int | None,
    n: int | None,
    k: int | None,
    dtype: str,
    epilogue: str,
    a_layout: str = "row_major",
    b_layout: str = "row_major",
    allow_tf32: bool = False,
    op: str = "matmul",
    fields: Sequence[str] = (),
) -> Workload:
    """The workload the options describe; ``fields`` are the operator's own, as NAME=VALUE
    (``batch=8``), each checked by the operator (a bad one names its option). M, N and K
    may be left out for an operator that derives them from its fields (conv2d)."""
    try:
        own = operator_fields(op, fields)
        if m is None or n is None or k is None:
            derived = Workload.from_dict({**own, "op": op, "m": m, "n": n, "k": k})
            m, n, k = derived.m, derived.n, derived.k
        return Workload(
            op=op,
            m=m,
            n=n,
            k=k,
            dtype=dtype,
            epilogue=epilogue,
            a_layout=a_layout,
            b_layout=b_layout,
            allow_tf32=allow_tf32,
            params=tuple(own.items()),
        )
    except InvalidSpec as exc:
        raise click.BadParameter(exc.reason, param_hint=param_hint(exc.field)) from None


def operator_fields(op: str, fields: Sequence[str]) -> dict[str, ParamValue]:
    """``--field NAME=VALUE`` options as the operator's own field values."""
    from tunehub.core.operators import get_operator
    from tunehub.core.registry import UnknownName

    if not fields:
        return {}
    try:
        operator = get_operator(op)
    except UnknownName:
        return {}  # the Workload names the unknown op
    own: dict[str, ParamValue] = {}
    for item in fields:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InvalidSpec("field", f"expected NAME=VALUE, got {item!r}")
        own[name.strip()] = operator.field(name.strip()).parse(value)
    return own


def param_hint(field: str) -> str:
    """How the command line names a workload's field: the shape is positional (``'M'``),
    the common fields are options (``--a-layout``), an operator's own go by ``--field``."""
    field = field.removeprefix("workload.")
    if field in ("m", "n", "k"):
        return f"'{field.upper()}'"
    if field in COMMON_FIELDS or field == "field":
        return f"--{field.replace('_', '-')}"
    return f"--field {field}"


class NumbersCommand(click.Command):
    """A command whose arguments may be negative numbers: ``tunehub tune -256 256 256`` is
    told that M must be >= 1, not that there is no option ``-2``.

    A token that looks like a negative number, where no option waits for its value, is an
    argument; an unknown option is still refused by name, with the options it might mean.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        takes_value: set[str] = set()
        known: set[str] = set(self.get_help_option_names(ctx))
        for param in self.get_params(ctx):
            if isinstance(param, click.Option):
                names = [*param.opts, *param.secondary_opts]
                known.update(names)
                if not param.is_flag and not param.count:
                    takes_value.update(param.opts)
        waiting = False
        for token in args:
            if token == "--":
                break
            if waiting:
                waiting = False
                continue
            name = token.split("=", 1)[0]
            if not token.startswith("-") or NEGATIVE.fullmatch(token):
                continue
            if name not in known:
                raise click.NoSuchOption(
                    name, possibilities=get_close_matches(name, sorted(known)), ctx=ctx
                )
            waiting = name in takes_value and "=" not in token
        # Every unknown token left is a negative number: click takes it as an argument.
        ctx.ignore_unknown_options = True
        return super().parse_args(ctx, args)


def workload_options(func: Any) -> Any:
    """The options that describe a workload besides its shape."""
    options = [
        click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True),
        click.option("--epilogue", type=click.Choice(EPILOGUES), default="none", show_default=True),
        click.option(
            "--a-layout", type=click.Choice(LAYOUTS), default="row_major", show_default=True
        ),
        click.option(
            "--b-layout",
            type=click.Choice(LAYOUTS),
            default="row_major",
            show_default=True,
            help="col_major: B is stored as a row-major N x K matrix (a linear layer's weight).",
        ),
        click.option("--allow-tf32", is_flag=True, help="float32: allow TensorFloat-32 products."),
        click.option(
            "--op",
            default="matmul",
            show_default=True,
            help="Operator (matmul, bmm, conv2d, ...); M N K are its GEMM view (per batch entry "
            "for bmm; conv2d derives them from its fields and takes none).",
        ),
        click.option(
            "--field",
            "fields",
            multiple=True,
            metavar="NAME=VALUE",
            help="One of the operator's own fields, e.g. --op bmm --field batch=8 "
            "--field b_broadcast=true (repeatable).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def open_store(url: str, *, init: bool) -> Any:
    """Open the store at ``url``; a brand-new database is created at head when ``init``.

    Every way this can fail (an unreachable or unwritable database, a schema at another
    revision, tables that no tunehub migration made) is a one-line error saying what to do.
    """
    from tunehub.db import SchemaOutOfDate, SqlScheduleStore, check_at_head
    from tunehub.db import upgrade as db_upgrade

    try:
        state = database_state(url)
        if state == "foreign":
            fail(database_problem(url, RuntimeError("tables but no revision")))
        if init and state == "empty":
            db_upgrade(url)
        check_at_head(url)
        return SqlScheduleStore(url)
    except SchemaOutOfDate as exc:
        fail(str(exc))
    except click.ClickException:
        raise
    except Exception as exc:
        fail(database_problem(url, exc))


def database_state(url: str) -> str:
    """``empty`` (no tables at all), ``migrated`` (an Alembic revision), or ``foreign``
    (tables but no revision: made outside tunehub's migrations, or its revision was lost)."""
    from sqlalchemy import inspect

    from tunehub.db import current_revision, make_engine

    if current_revision(url) is not None:
        return "migrated"
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
    finally:
        engine.dispose()
    return "foreign" if tables else "empty"


def database_problem(url: str, exc: BaseException) -> str:
    """One line saying why the database at ``url`` cannot be used, and what to do."""
    from sqlalchemy.exc import DBAPIError

    from tunehub.db.engine import safe_url

    where = f"database {safe_url(url)}"
    if str(exc) == "tables but no revision" or (
        isinstance(exc, DBAPIError) and "already exists" in str(exc.orig)
    ):
        return (
            f"{where} has tables but no tunehub schema revision: tunehub did not create "
            "it (or its alembic_version table was lost); use an empty database, or "
            "restore alembic_version"
        )
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        reason = " ".join(str(exc.orig).split())[:300]
        if database_state_safe(url) == "foreign":
            return (
                f"{where} has tables but no tunehub schema revision: tunehub did not create "
                "it (or its alembic_version table was lost); use an empty database, or "
                "restore alembic_version"
            )
        if "readonly" in reason or "read-only" in reason:
            return f"{where} is read-only ({reason}); tunehub needs to write to it"
        return (
            f"{where} cannot be used: {reason}; check TUNEHUB_DATABASE_URL and that the "
            "server is up and reachable"
        )
    return f"{where} cannot be used: {type(exc).__name__}: {exc}"


def database_state_safe(url: str) -> str | None:
    try:
        return database_state(url)
    except Exception:
        return None


def store_url() -> str:
    """The database URL of the settings (the data dir checked first)."""
    settings = load_settings()
    data_home(settings)
    url: str = settings.resolved_database_url()
    return url


def server_url(url: str | None) -> str | None:
    return url or os.environ.get("TUNEHUB_URL")
