"""Drafters in the formats their authors publish (EAGLE-3, DFlash, DeepSpec's DFlash and DSpark, the
MTP modules inside a target), run through the same Drafter protocol and engine as specbench's own.

- checkpoint.py: a local directory or hub id, its config.json and weight names.
- formats/: which format a checkpoint is in (DrafterSource), each method's formats in a module of its name.
- eagle3.py, block.py (DFlash, DSpark), mtp.py (MTP in the target): each format's network and loader,
  behind the drafters of strategies/eagle.py, dflash.py, dspark.py and mtp.py; a format's `code` names its module.
- convert.py: a published checkpoint into specbench's own format and back, where the shapes allow.
- to_vllm.py: specbench's drafters in the layouts vLLM loads (each method's Method.vllm_drafter).
"""

from __future__ import annotations

import importlib
from typing import Any

from specbench.model_source import DEFAULT_MODEL
from specbench.strategies.published.formats import DrafterSource
from specbench.strategies.registry import definition


def _code(source: DrafterSource):
    """The module of strategies/published/ that reads the source's format, as its method declares it."""
    fmt = next(fmt for fmt in definition(source.strategy).formats if fmt.name == source.format)
    return importlib.import_module(f"specbench.strategies.published.{fmt.code}")


def knob_defaults(source: DrafterSource) -> dict[str, Any]:
    """The knob values a published checkpoint was made for (its block size, its confidence rule, ...);
    the user's --set and TOML values override them."""
    return _code(source).knob_defaults(source)


def load(source: DrafterSource, target, options):
    """The Drafter for a published checkpoint, checked against the target before any decoding."""
    return _code(source).load(source, target, options)


def builtin_source(strategy: str, target) -> DrafterSource | None:
    """A drafter the target carries itself (its own MTP modules, for `mtp` without a --drafter), as the
    method declares it (Method.builtin)."""
    builtin = definition(strategy).builtin
    if builtin is None or target.name == DEFAULT_MODEL:
        return None
    return builtin(target)
