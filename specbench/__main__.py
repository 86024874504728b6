"""`python -m specbench`: the same command line as `specbench`."""

from specbench.cli import app

app(prog_name="specbench")
