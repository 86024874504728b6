"""A checkpoint as its authors ship it: a local directory or a cached hub id, its config.json and weights.

Weight names come from the safetensors headers or a shard index, so a format is recognised without
reading any tensor (and without importing torch, for checkpoints in safetensors: a bad --drafter is
refused in well under a second); tensors are read only for the names a loader asks for.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import SafetensorError, safe_open

from specbench.core.errors import SpecbenchError
from specbench.core.files import read_json
from specbench.decoding.model_source import looks_like_path, model_path
from specbench.methods.drafter_config import read_drafter_config

if TYPE_CHECKING:
    import torch

SAFETENSORS, BIN = "model.safetensors", "pytorch_model.bin"
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


@dataclass
class Checkpoint:
    path: Path
    hub_id: str | None = None  # where it was fetched from
    config: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.hub_id or str(self.path)

    @functools.cached_property
    def files(self) -> dict[str, Path]:
        """Every weight name and the file it is in: an index's weight map, or the one weights file."""
        for index in INDEXES:
            if (self.path / index).is_file():
                try:
                    weight_map = read_json(self.path / index, f"{self.name}: shard index")["weight_map"]
                except KeyError as exc:
                    raise SpecbenchError(f"{self.name}: {index} is not a shard index ({exc})") from None
                return {k: self.path / v for k, v in weight_map.items()}
        if (self.path / SAFETENSORS).is_file():
            return dict.fromkeys(_safetensors_names(self.path / SAFETENSORS), self.path / SAFETENSORS)
        if (self.path / BIN).is_file():
            return dict.fromkeys(_bin_state(self.path / BIN), self.path / BIN)
        raise SpecbenchError(f"{self.name}: no weights ({SAFETENSORS}, {BIN} or a shard index) in {self.path}")

    def weight_names(self) -> set[str]:
        return set(self.files)

    def dtype(self) -> torch.dtype:
        """The dtype the weights are stored in (of the first of them)."""
        first = min(self.files)
        return self.load([first])[first].dtype

    def load(self, names) -> dict[str, torch.Tensor]:
        """The named tensors, as stored (dtype included)."""
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.files[name], []).append(name)
        out: dict[str, torch.Tensor] = {}
        for path, wanted in by_file.items():
            if path.suffix == ".safetensors":
                try:
                    with safe_open(str(path), framework="pt", device="cpu") as f:
                        out.update({name: f.get_tensor(name) for name in wanted})
                except (SafetensorError, OSError) as exc:
                    raise SpecbenchError(f"{self.name}: cannot read {path.name} ({exc})") from None
            else:
                state = _bin_state(path)
                out.update({name: state[name] for name in wanted})
        return out


def _safetensors_names(path: Path) -> list[str]:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return list(f.keys())
    except (SafetensorError, OSError) as exc:
        raise SpecbenchError(f"{path}: not a readable safetensors file ({exc})") from None


def _bin_state(path: Path) -> dict[str, torch.Tensor]:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError) as exc:  # pickle errors surface as RuntimeError / EOFError
        raise SpecbenchError(f"{path}: not a readable PyTorch weights file ({str(exc).splitlines()[0]})") from None


def open_checkpoint(name: str | Path) -> Checkpoint:
    """A local directory, or a hub id already in the Hugging Face cache (specbench downloads nothing)."""
    text = str(name)
    path = Path(model_path(text, what="drafter"))
    hub_id = None if Path(text).expanduser().exists() or looks_like_path(text) else text
    return Checkpoint(path, hub_id, read_drafter_config(path, text))
