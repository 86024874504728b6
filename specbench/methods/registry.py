"""Every drafting method, by the name the command line uses; each method is one module here.

Names are known without importing the method modules (they import torch), so a strategy name is
checked at once; a method's definition (its knobs, search space, builder and serving forms)
is imported on first use. The published checkpoint formats a method reads are declared, torch-free,
in methods/published/<its module>_formats.py, so a --drafter is told before torch loads.
Adding a method means its module (and its formats' modules) and one line in MODULES.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # base.py imports torch; names and the parser must not
    from specbench.methods.base import Method
    from specbench.methods.published.formats import Format

MODULES = {  # strategy name -> module in specbench.methods
    "ngram": "ngram",
    "draft": "draft_model",
    "eagle": "eagle",
    "mtp": "mtp",
    "dflash": "dflash",
    "dspark": "dspark",
    "suffix": "suffix",
}
DRAFTER_NAMES = tuple(MODULES)
SERVED = ("ngram", "eagle", "dflash")  # what `specbench serve` measures without --strategy


@functools.cache
def definition(name: str) -> Method:
    """The Method a method module declares as STRATEGY."""
    return importlib.import_module(f"specbench.methods.{MODULES[name]}").STRATEGY


@functools.cache
def formats(name: str) -> tuple[Format, ...]:
    """The published checkpoint formats a method reads (torch-free): methods/published/<its module>_formats.py."""
    module = f"specbench.methods.published.{MODULES[name]}_formats"
    return importlib.import_module(module).FORMATS if importlib.util.find_spec(module) else ()


def definitions() -> dict[str, Method]:
    return {name: definition(name) for name in DRAFTER_NAMES}


def vllm_method(name: str) -> str | None:
    """vLLM's speculative method for a strategy name; None for a combination or a method vLLM lacks."""
    if name not in MODULES or definition(name).serving is None:
        return None
    d = definition(name)
    config = d.serving(d.options(), d.default_controller, None).vllm
    return config["method"] if config else None
