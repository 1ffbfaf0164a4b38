"""``python -m tunehub.cli``: the ``tunehub`` command."""

from tunehub.cli import main

if __name__ == "__main__":
    main(prog_name="tunehub")
