"""Which format a drafter checkpoint is in, told from its config.json and weight names alone.

Each method declares the published formats it reads in a module of this package named after its own
module (eagle_formats.py for methods/eagle.py), torch-free, so a --drafter is told and refused
before torch loads (methods/registry.py finds them by the method's module name; the method module never
imports them, as the code that reads a format imports the method). A format names the module of
methods/published/ that reads it (`code`) and, for the one a specbench drafter of the method is written
in for vLLM, its writer (`vllm_writer`).

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
from typing import Any, Callable

from specbench.core.errors import SpecbenchError
from specbench.methods.names import StrategyName
from specbench.methods.published.checkpoint import Checkpoint, open_checkpoint
from specbench.methods.registry import DRAFTER_NAMES, formats

SPECBENCH = "specbench"
SPECBENCH_DESCRIPTION = "a specbench drafter directory"


@dataclass(frozen=True)
class Format:
    """A checkpoint layout as its authors publish it, as the method that reads it declares it."""

    name: str
    description: str
    # told from config.json and weight names (torch-free); None: never a --drafter (see builtin)
    detect: Callable[[Checkpoint], bool] | None = None
    # a checkpoint that resembles this format but is not one: the one-line reason it is refused, else None;
    # asked once no format's detect matched
    lookalike: Callable[[Checkpoint], str | None] | None = None
    last_resort: bool = False  # detected only when no other format is (any causal LM is a draft model)
    # module in methods/published/ with load(source, target, options) -> Drafter and
    # knob_defaults(source) -> dict; None: the method's own builder reads it
    code: str | None = None
    # the target carries it itself (its own MTP modules): found by builtin_source(target) -> DrafterSource | None
    # of its code module
    builtin: bool = False
    vllm_as_is: bool = False  # vLLM loads a checkpoint of it as it is
    # "module.function" in methods/published/ that writes a specbench drafter of the method in this layout for
    # vLLM: (source, target, out, mask_token_id) -> Conversion; at most one format of a method names one
    vllm_writer: str | None = None


def deepspec_architecture(config: dict) -> str | None:
    """The DeepSpec model class a config names (it ships DFlash, DSpark and EAGLE-3 drafters), if any."""
    return next((a for a in config.get("architectures") or [] if a.endswith(("DSparkModel", "Eagle3Model"))), None)


def deepspec_block(config: dict) -> bool:
    """DeepSpec's Qwen3 block drafter (DFlash or DSpark by its Markov head), the one DeepSpec class read here."""
    found = deepspec_architecture(config)
    return found == "Qwen3DSparkModel" or (found is None and {"markov_rank", "target_layer_ids"} <= set(config))


def declared() -> list[tuple[str, Format]]:
    """Every (strategy, format) the methods declare, in the registry's order."""
    return [(strategy, fmt) for strategy in DRAFTER_NAMES for fmt in formats(strategy)]


def format_named(name: str) -> Format | None:
    return next((fmt for _, fmt in declared() if fmt.name == name), None)


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
        """Read by a published format's own loader (not specbench's, nor a draft model's)."""
        fmt = format_named(self.format)
        return fmt is not None and fmt.code is not None

    @property
    def description(self) -> str:
        return SPECBENCH_DESCRIPTION if self.format == SPECBENCH else format_named(self.format).description

    def describe(self) -> dict[str, Any]:
        """What the run's environment record shows."""
        return {"format": self.format, "description": self.description, "path": str(self.path),
                "hub_id": self.checkpoint.hub_id}


def _first_match(checkpoint: Checkpoint, found: list[tuple[str, Format]], last_resort: bool) -> DrafterSource | None:
    for strategy, fmt in found:
        if fmt.detect is not None and fmt.last_resort == last_resort and fmt.detect(checkpoint):
            return DrafterSource(strategy, fmt.name, checkpoint)
    return None


def detect(checkpoint: Checkpoint) -> DrafterSource:
    """The format and strategy of a checkpoint; one line naming what was found when it is none of them."""
    config, name = checkpoint.config, checkpoint.name
    if "specbench_strategy" in config:
        return DrafterSource(config["specbench_strategy"], SPECBENCH, checkpoint)
    found = declared()
    source = _first_match(checkpoint, found, last_resort=False)
    if source is not None:
        return source
    for _, fmt in found:
        why = fmt.lookalike(checkpoint) if fmt.lookalike is not None else None
        if why is not None:
            raise SpecbenchError(f"drafter {name}: {why}")
    source = _first_match(checkpoint, found, last_resort=True)
    if source is not None:
        return source
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
            raise SpecbenchError(f"--drafter {name} is {source.description}, for strategy {source.strategy}, "
                                 f"which this run does not use (its drafting strategies: {', '.join(used) or 'none'})")
        out[source.strategy] = source
    return out


def drafters_used_by(dirs: list[str | Path], specs: list[StrategyName]) -> list[str | Path]:
    """The --drafter values some strategy of `specs` uses, in their order: what a run of fewer strategies with
    the same drafters is given (drafter_dirs_by_strategy refuses the others)."""
    used = {member for spec in specs for member in spec.members}
    return [name for name in dirs if open_source(name).strategy in used]
