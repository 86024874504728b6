"""A drafter directory's config.json, read without torch: specbench's own drafters (drafter_dir.py) and
published checkpoints (published/checkpoint.py) alike."""

from __future__ import annotations

from pathlib import Path

from specbench.core.errors import SpecbenchError
from specbench.core.files import read_json

CONFIG = "config.json"


def read_drafter_config(path: Path, name: str | None = None) -> dict:
    """A drafter directory's config.json; errors call it `name` (a hub id it came from) or its path."""
    path = Path(path)
    what = f"drafter {name}" if name else f"drafter directory {path}"
    if not path.is_dir():
        raise SpecbenchError(f"{what} does not exist")
    return read_json(path / CONFIG, f"{what}: config file")
