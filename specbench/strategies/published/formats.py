"""Which format a drafter checkpoint is in, told from its config.json and weight names alone.

| format | who ships it | strategy |
| --- | --- | --- |
| specbench | `specbench train` (config.json names `specbench_strategy`) | its own |
| draft-lm | any causal LM (a `model_type` and LM weights) | draft |
| eagle3 | SafeAILab/EAGLE, SpecForge: `draft_vocab_size`, `midlayer.*` | eagle |
| dflash | z-lab/dflash: `dflash_config`, `DFlashDraftModel` | dflash |
| deepspec-dflash | deepseek-ai/DeepSpec, `Qwen3DSparkModel` with `markov_rank` 0 | dflash |
| deepspec-dspark | deepseek-ai/DeepSpec, `Qwen3DSparkModel` with a Markov head | dspark |
| mtp-* | MTP modules inside the target's own checkpoint (published/mtp.py) | mtp |
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench.core.errors import SpecbenchError
from specbench.strategies.names import StrategyName
from specbench.strategies.published.checkpoint import Checkpoint, open_checkpoint
from specbench.strategies.registry import DRAFTER_NAMES

FORMATS = {  # format -> (strategy, what it is)
    "specbench": (None, "a specbench drafter directory"),
    "draft-lm": ("draft", "a causal language model (a draft model)"),
    "eagle3": ("eagle", "an EAGLE-3 drafter (SafeAILab/EAGLE, SpecForge)"),
    "dflash": ("dflash", "a DFlash drafter (z-lab/dflash)"),
    "deepspec-dflash": ("dflash", "a DFlash drafter in DeepSpec's layout (deepseek-ai/DeepSpec)"),
    "deepspec-dspark": ("dspark", "a DSpark drafter (deepseek-ai/DeepSpec)"),
    "mtp-deepseek-v3": ("mtp", "the target's own MTP modules, DeepSeek-V3 layout (model.layers.L+k)"),
    "mtp-qwen3-next": ("mtp", "the target's own MTP module, Qwen3-Next layout (mtp.*)"),
    "mtp-mimo": ("mtp", "the target's own MTP modules, MiMo layout (model.mtp_layers.*)"),
}


@dataclass
class DrafterSource:
    """Where a strategy's drafter comes from, and in which format."""

    strategy: str
    format: str
    checkpoint: Checkpoint

    @property
    def path(self) -> Path:
        return self.checkpoint.path

    @property
    def published(self) -> bool:
        return self.format not in ("specbench", "draft-lm")

    def describe(self) -> dict[str, Any]:
        """What the run's environment record shows."""
        return {"format": self.format, "description": FORMATS[self.format][1], "path": str(self.path),
                "hub_id": self.checkpoint.hub_id}


def _deepspec_architecture(arch: list[str]) -> str | None:
    return next((a for a in arch if a.endswith(("DSparkModel", "Eagle3Model"))), None)


def detect(checkpoint: Checkpoint) -> DrafterSource:
    """The format and strategy of a checkpoint; one line naming what was found when it is none of them."""
    config, name = checkpoint.config, checkpoint.name
    if "specbench_strategy" in config:
        return DrafterSource(config["specbench_strategy"], "specbench", checkpoint)
    arch = config.get("architectures") or []
    deepspec = _deepspec_architecture(arch)
    if deepspec == "Qwen3DSparkModel" or (deepspec is None and {"markov_rank", "target_layer_ids"} <= set(config)):
        fmt = "deepspec-dspark" if int(config.get("markov_rank", 0)) > 0 else "deepspec-dflash"
        return DrafterSource(FORMATS[fmt][0], fmt, checkpoint)
    if deepspec is not None:
        raise SpecbenchError(f"drafter {name}: DeepSpec's {deepspec} checkpoints are not supported "
                             "(DeepSpec's Qwen3 DFlash and DSpark checkpoints are, and EAGLE-3 in SafeAILab's layout)")
    if "dflash_config" in config or "DFlashDraftModel" in arch:
        return DrafterSource("dflash", "dflash", checkpoint)
    names = checkpoint.weight_names()
    if "draft_vocab_size" in config or any(n.startswith("midlayer.") for n in names):
        return DrafterSource("eagle", "eagle3", checkpoint)
    if "fc.weight" in names and any(n.startswith("layers.0.") for n in names):
        raise SpecbenchError(f"drafter {name}: an EAGLE-1/EAGLE-2 checkpoint (fc over [embedding, feature], "
                             "layers.N); only EAGLE-3 checkpoints are supported")
    if "model_type" in config:
        return DrafterSource("draft", "draft-lm", checkpoint)
    raise SpecbenchError(f"drafter {name}: none of the known formats (specbench, EAGLE-3, DFlash, DeepSpec "
                         "DFlash/DSpark, a causal LM): its config.json has no specbench_strategy, "
                         "draft_vocab_size, dflash_config, markov_rank or model_type")


def open_source(name: str | Path) -> DrafterSource:
    """A --drafter value (a local directory or a hub id) and its detected format."""
    return detect(open_checkpoint(name))


def drafter_dirs_by_strategy(dirs: list[str | Path], specs: list[StrategyName]) -> dict[str, DrafterSource]:
    """Which strategy each --drafter (a directory or a hub id) is for, as its detected format says.

    Runs before any model is loaded: a drafter that no strategy of the run would use, or two for one
    strategy, is refused here rather than ignored.
    """
    used = sorted({member for spec in specs for member in spec.members}, key=DRAFTER_NAMES.index)
    out: dict[str, DrafterSource] = {}
    for name in dirs:
        source = open_source(name)
        if source.strategy not in DRAFTER_NAMES:
            raise SpecbenchError(f"drafter {name} names strategy {source.strategy!r}; "
                                 f"known: {', '.join(DRAFTER_NAMES)}")
        if source.strategy in out:
            raise SpecbenchError(f"two --drafter values for {source.strategy}: {out[source.strategy].path} and {name}")
        if source.strategy not in used:
            raise SpecbenchError(f"--drafter {name} is {FORMATS[source.format][1]}, for strategy {source.strategy}, "
                                 f"which this run does not use (its drafting strategies: {', '.join(used) or 'none'})")
        out[source.strategy] = source
    return out


def drafters_used_by(dirs: list[str | Path], specs: list[StrategyName]) -> list[str | Path]:
    """The --drafter values some strategy of `specs` uses, in their order: what a run of fewer strategies with
    the same drafters is given (drafter_dirs_by_strategy refuses the others)."""
    used = {member for spec in specs for member in spec.members}
    return [name for name in dirs if open_source(name).strategy in used]
