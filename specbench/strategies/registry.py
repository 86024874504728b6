"""Every drafting method, by the name the command line uses; each method is one module here.

Names are known without importing the method modules (they import torch), so a strategy name is
checked at once; a method's definition (its knobs, search space and builder) is imported on first
use. Adding a method means one new module and one line in MODULES.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # base.py imports torch; names and the parser must not
    from specbench.strategies.base import Method

MODULES = {  # strategy name -> module in specbench.strategies
    "ngram": "ngram",
    "draft": "draft_model",
    "eagle": "eagle",
    "mtp": "mtp",
    "dflash": "dflash",
    "dspark": "dspark",
    "suffix": "suffix",
}
DRAFTER_NAMES = tuple(MODULES)


@functools.cache
def definition(name: str) -> Method:
    """The Method a method module declares as STRATEGY."""
    return importlib.import_module(f"specbench.strategies.{MODULES[name]}").STRATEGY


def definitions() -> dict[str, Method]:
    return {name: definition(name) for name in DRAFTER_NAMES}


def vllm_method(name: str) -> str | None:
    """vLLM's speculative method for a strategy name; None for a combination or a method vLLM lacks."""
    if name not in MODULES or definition(name).serving is None:
        return None
    d = definition(name)
    config = d.serving(d.options(), d.default_controller, None).vllm
    return config["method"] if config else None
