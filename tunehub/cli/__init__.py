"""The ``tunehub`` command line: serve, worker, tune, watch, lookup, jobs, db, keys.

One module per command group: ``serve`` (serve, worker), ``tune`` (and ``progress``, its
output), ``watch``, ``lookup`` (lookup, jobs), ``admin`` (db, keys); ``common`` holds what
they share.
"""

from __future__ import annotations

import logging

import click

from tunehub.cli.admin import db, keys
from tunehub.cli.lookup import jobs, lookup
from tunehub.cli.serve import serve, worker
from tunehub.cli.tune import tune
from tunehub.cli.watch import watch

__all__ = ["main"]


@click.group()
@click.version_option(package_name="tunehub")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """tunehub: tune compute kernels, store the best schedules, answer lookups.

    Data lives in $TUNEHUB_HOME (default ~/.tunehub); TUNEHUB_DATABASE_URL picks another
    database (e.g. postgresql://user@host/db).
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


for command in (serve, worker, tune, watch, lookup, jobs, db, keys):
    main.add_command(command)
