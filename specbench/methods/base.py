"""What a strategy module declares: its name, its knobs, their search space and how to build its drafter."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from specbench.core.errors import SpecbenchError
from specbench.decoding.drafting import Drafter
from specbench.decoding.linear import bf16_native, onednn
from specbench.decoding.model_source import known_model
from specbench.decoding.target import fingerprint
from specbench.methods.drafter_config import CONFIG, read_drafter_config
from specbench.methods.drafter_dir import load_drafter
from specbench.methods.search_space import SearchSpace
from specbench.methods.serving import Serving


@dataclass(frozen=True)
class Method:
    """A speculative-decoding method as its module declares it: knobs, drafter builder, search space, serving forms."""

    name: str
    options: type  # dataclass of knobs with defaults
    build: Callable[..., Drafter]  # (target, options, drafter_dir | None) -> Drafter
    budget: Callable[[Any], int]  # the controller's starting depth from the knobs
    # drafts -> the knobs that keep one sequence's verified tokens per step at drafts + 1 (the prior's load rule)
    short_draft: Callable[[int], dict[str, Any]]
    default_controller: str = "fixed"
    trainable: Callable[..., Any] | None = None  # (target, options) -> a fresh trainable drafter nn.Module
    space: SearchSpace = SearchSpace()  # what `specbench tune` searches; `controller` names the controller choice
    limits: Callable[[Drafter], dict[str, int]] | None = None  # values of the loaded drafter that bounds can name
    model_free: bool = False  # drafts from the context alone (prompt lookup, suffix trees): no drafter to load
    tree: bool = False  # drafts token trees (verified with a tree mask, at batch size 1 only), not chains
    # (options, controller, drafter path or None) -> its vLLM and SGLang forms (methods/serving.py)
    serving: Callable[[Any, str, str | None], Serving] | None = None
    # its vLLM form loads a drafter checkpoint (speculative_config["model"]): specbench's written by the
    # vllm_writer of one of its formats (methods/published/<its module>_formats.py), else its directory as it is
    vllm_drafter: bool = False
    no_vllm_drafter: str | None = None  # why a specbench drafter of it has no vLLM layout, where it has a reason
    vllm_only_from: str | None = None  # the published checkpoint its vLLM form runs only from (refused without one)


def own_drafter(target, strategy: str) -> Path | None:
    """The drafter a known model keeps for `strategy` (the embedded default's, or one `specbench prepare`
    built); None where it has none."""
    known = known_model(target.name)
    path = known.drafter_dir(strategy) if known is not None else None
    return path if path is not None and (path / "config.json").is_file() else None


# in a specbench drafter's config.json: the knob values that draft best with it on its own model and
# hardware (chosen by `specbench tune`), which a run takes under the user's own
DRAFTING = "drafting"


def drafting_defaults(target, strategy: str, drafter_dir: Path | None) -> dict[str, Any]:
    """The drafting knob values the drafter `strategy` would load carries; {} where it carries none or
    there is no drafter (which loading it then says)."""
    path = Path(drafter_dir) if drafter_dir is not None else own_drafter(target, strategy)
    if path is None or not (path / CONFIG).is_file():
        return {}
    return dict(read_drafter_config(path).get(DRAFTING, {}))


def default_drafter_dir(target, strategy: str, drafter_dir: Path | None) -> Path:
    """`drafter_dir`, or the known model's own drafter when the target is one."""
    if drafter_dir is not None:
        return Path(drafter_dir)
    path = own_drafter(target, strategy)
    if path is not None:
        return path
    known = known_model(target.name)
    if known is not None:
        raise SpecbenchError(f"strategy {strategy}: {known.name} has no {strategy} drafter yet; build its drafters "
                             f"with `specbench prepare {known.name}`, or give one with --drafter DIR")
    raise SpecbenchError(f"strategy {strategy}: give a drafter trained for {target.name} with --drafter DIR "
                         f"(train one with `specbench train --strategy {strategy}`)")


def drafting_dtype(target) -> torch.dtype:
    """The dtype a drafter drafts in beside `target`: bfloat16 beside a float32 target on a CPU that multiplies
    bfloat16 natively, through oneDNN, else the target's. A drafter step there is bound by reading its weights
    from memory (the target's forward has just evicted them from the cache), and half the bytes draft
    faster; what it drafts is verified against the float32 target, so the output does not change."""
    dtype = target.model.dtype
    if target.device.type == "cpu" and dtype == torch.float32 and bf16_native(target.device) and onednn(torch.bfloat16):
        return torch.bfloat16
    return dtype


def load_trained(target, strategy: str, drafter_dir: Path | None,
                 make_model: Callable[[dict], torch.nn.Module], dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A trained drafter network, checked against its strategy and target, on the target's device and in
    `dtype` (the target's unless given)."""
    path = default_drafter_dir(target, strategy, drafter_dir)
    config, state = load_drafter(path, strategy, fingerprint(target.model))
    model = make_model(config)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise SpecbenchError(f"drafter {path}: weights do not match its config ({str(exc).splitlines()[0]})") from None
    return model.to(target.device, dtype or target.model.dtype).eval()
