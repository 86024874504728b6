"""Drafters in the formats their authors publish (EAGLE-3, DFlash, DeepSpec's DFlash and DSpark, the
MTP modules inside a target), run through the same Drafter protocol and engine as specbench's own.

- checkpoint.py: a local directory or hub id, its config.json and weight names.
- formats.py: which format a checkpoint is in (DrafterSource); each method's formats in <its module>_formats.py.
- eagle3.py, block.py (DFlash, DSpark), deepseek_mtp.py (MTP in the target): each format's network and loader,
  behind the drafters of methods/eagle.py, dflash.py, dspark.py and mtp.py; a format's `code` names its module.
- convert.py: a published checkpoint into specbench's own format and back, where the shapes allow.
- to_vllm.py: specbench's drafters in the layouts vLLM loads (the format a method's drafter is written in
  names its writer: Format.vllm_writer).
"""

from __future__ import annotations

import importlib
from typing import Any

from specbench.decoding.model_source import DEFAULT_MODEL
from specbench.methods import registry
from specbench.methods.published.formats import DrafterSource


def module(name: str):
    """A module of methods/published/ by its name, as a format declares it (Format.code, Format.vllm_writer)."""
    return importlib.import_module(f"specbench.methods.published.{name}")


def _code(source: DrafterSource):
    return module(next(fmt.code for fmt in registry.formats(source.strategy) if fmt.name == source.format))


def knob_defaults(source: DrafterSource) -> dict[str, Any]:
    """The knob values a published checkpoint was made for (its block size, its confidence rule, ...);
    the user's --set and TOML values override them."""
    return _code(source).knob_defaults(source)


def load(source: DrafterSource, target, options):
    """The Drafter for a published checkpoint, checked against the target before any decoding."""
    return _code(source).load(source, target, options)


def builtin_source(strategy: str, target) -> DrafterSource | None:
    """A drafter the target carries itself (its own MTP modules, for `mtp` without a --drafter): found by
    builtin_source(target) of the code module of the method's `builtin` formats."""
    if target.name == DEFAULT_MODEL:
        return None
    for code in dict.fromkeys(fmt.code for fmt in registry.formats(strategy) if fmt.builtin):
        found = module(code).builtin_source(target)
        if found is not None:
            return found
    return None
