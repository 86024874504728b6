"""`python -m specbench`: the same command line as `specbench`."""

from specbench.cli import app

if __name__ == "__main__":  # not when a spawned tune worker re-imports the main module
    app(prog_name="specbench")
