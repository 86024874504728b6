"""A trained drafter on disk: config.json (strategy, architecture, knobs, target fingerprint)
and model.safetensors. Written atomically; loading checks the strategy and the target."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specbench.core.errors import SpecbenchError
from specbench.core.files import atomic_path
from specbench.methods.drafter_config import CONFIG, read_drafter_config

WEIGHTS = "model.safetensors"


def write_checkpoint(out_dir: Path, config: dict, state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """config.json and model.safetensors written beside `out_dir`, then renamed into place: never a
    half-written directory."""
    with atomic_path(Path(out_dir)) as staging:
        staging.mkdir(parents=True)
        (staging / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file({k: _stored(v, dtype) for k, v in state.items()}, str(staging / WEIGHTS))


def _stored(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Weights in `dtype`; token ids (a draft vocabulary) as they are."""
    tensor = tensor.detach().contiguous().cpu()
    return tensor.to(dtype) if tensor.is_floating_point() else tensor


def save_drafter(out_dir: Path, strategy: str, config: dict, state: dict[str, torch.Tensor],
                 fingerprint: str, dtype: torch.dtype = torch.bfloat16) -> None:
    """A specbench drafter directory: the strategy and the target's fingerprint join its config."""
    meta = {"specbench_strategy": strategy, "target_fingerprint": fingerprint, **config}
    write_checkpoint(out_dir, meta, state, dtype)


def load_drafter(path: Path, strategy: str, fingerprint: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """The drafter's config and float32 weights (token ids as stored), after checking it is a `strategy`
    drafter for this target."""
    config = read_drafter_config(path)
    found = config.get("specbench_strategy")
    if found != strategy:
        raise SpecbenchError(f"drafter directory {path} holds a {found or 'non-specbench'} drafter, not {strategy}")
    if config.get("target_fingerprint") != fingerprint:
        raise SpecbenchError(f"drafter {path} was trained for another target (fingerprint "
                             f"{config.get('target_fingerprint')}, this target is {fingerprint})")
    try:
        state = load_file(str(Path(path) / WEIGHTS))
    except (FileNotFoundError, SafetensorError, OSError) as exc:
        raise SpecbenchError(f"drafter {path}: {WEIGHTS} is missing or corrupt ({exc})") from None
    return config, {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
