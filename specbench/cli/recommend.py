"""`specbench recommend`: a strategy for a workload and a GPU."""

from __future__ import annotations

from specbench.cli.app import app, not_implemented


@app.command()
def recommend() -> None:
    """Pick a strategy for a workload and a GPU (not implemented yet)."""
    not_implemented("recommend")
