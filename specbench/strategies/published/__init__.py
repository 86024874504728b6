"""Drafters in the formats their authors publish (EAGLE-3, DFlash, DeepSpec's DFlash and DSpark, the
MTP modules inside a target), run through the same Drafter protocol and engine as specbench's own.

- checkpoint.py: a local directory or hub id, its config.json and weight names.
- formats.py: which format a checkpoint is in, and the strategy it serves (DrafterSource).
- eagle3.py, block.py (DFlash, DSpark), mtp.py (MTP in the target): each format's network and loader,
  behind the drafters of strategies/eagle.py, dflash.py, dspark.py and mtp.py.
- convert.py: a published checkpoint into specbench's own format and back, where the shapes allow.
"""

from __future__ import annotations

from typing import Any

from specbench.model_source import DEFAULT_MODEL
from specbench.strategies.published.formats import DrafterSource


def _loader(fmt: str):
    from specbench.strategies.published import block, eagle3, mtp

    return {"eagle3": (eagle3.load, lambda source: {}),
            "dflash": (block.load, block.knob_defaults),
            "deepspec-dflash": (block.load, block.knob_defaults),
            "deepspec-dspark": (block.load, block.knob_defaults),
            "mtp-deepseek-v3": (mtp.load, mtp.knob_defaults),
            "mtp-qwen3-next": (mtp.load, mtp.knob_defaults),
            "mtp-mimo": (mtp.load, mtp.knob_defaults)}[fmt]


def knob_defaults(source: DrafterSource) -> dict[str, Any]:
    """The knob values a published checkpoint was made for (its block size, its confidence rule, ...);
    the user's --set and TOML values override them."""
    return _loader(source.format)[1](source)


def load(source: DrafterSource, target, options):
    """The Drafter for a published checkpoint, checked against the target before any decoding."""
    return _loader(source.format)[0](source, target, options)


def builtin_source(strategy: str, target) -> DrafterSource | None:
    """A drafter the target carries itself: its own MTP modules, for `mtp` without a --drafter."""
    if strategy != "mtp" or target.name == DEFAULT_MODEL:
        return None
    from specbench.strategies.published.mtp import builtin_source as mtp_source

    return mtp_source(target)
