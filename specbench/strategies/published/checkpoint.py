"""A checkpoint as its authors ship it: a local directory or a hub id, its config.json and weights.

Weight names come from the safetensors headers or a shard index, so a format can be recognised
without reading any tensor; tensors are read only for the names a loader asks for.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from specbench.errors import SpecbenchError
from specbench.strategies.drafter_dir import read_drafter_config

SAFETENSORS, BIN = "model.safetensors", "pytorch_model.bin"
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


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
                    weight_map = json.loads((self.path / index).read_text())["weight_map"]
                except (json.JSONDecodeError, KeyError) as exc:
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
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError) as exc:  # pickle errors surface as RuntimeError / EOFError
        raise SpecbenchError(f"{path}: not a readable PyTorch weights file ({str(exc).splitlines()[0]})") from None


def fetch(hub_id: str) -> Path:
    """The local snapshot of a hub repository (downloaded when there is a network, else from the cache)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        path = Path(snapshot_download(hub_id, allow_patterns=["*.json", "*.safetensors"]))
        if not any(path.glob("*.safetensors")):  # an older checkpoint: PyTorch weights only
            path = Path(snapshot_download(hub_id, allow_patterns=["*.json", "*.bin"]))
        return path
    except (OSError, ValueError, HfHubHTTPError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SpecbenchError(f"drafter {hub_id}: not a local directory, and the hub id could not be fetched "
                             f"({reason}); download it and pass the local directory with --drafter DIR") from None


def open_checkpoint(name: str | Path) -> Checkpoint:
    """A local directory, or a hub id `owner/name` fetched into the local cache."""
    text = str(name)
    path = Path(text).expanduser()
    if path.is_dir():
        return Checkpoint(path, None, read_drafter_config(path, text))
    if path.exists() or text.startswith((".", "/", "~")) or not HUB_ID.match(text):
        raise SpecbenchError(f"drafter directory {text} does not exist")
    local = fetch(text)
    return Checkpoint(local, text, read_drafter_config(local, text))
