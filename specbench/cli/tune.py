"""`specbench tune`: Optuna search of strategy knobs."""

from __future__ import annotations

from specbench.cli.app import app, not_implemented


@app.command()
def tune() -> None:
    """Search strategy knobs with Optuna (not implemented yet)."""
    not_implemented("tune")
