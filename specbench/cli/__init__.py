"""The `specbench` command line: each command parses its options, calls a library function and prints.

One module per command (or small group of commands); importing them registers them on `app`, in
the order `specbench --help` lists them.
"""

from specbench.cli import run, serve, costs, tune, recommend, report, train, models, convert, info  # noqa: F401, I001  (registers the commands)
from specbench.cli.app import app

__all__ = ["app"]
