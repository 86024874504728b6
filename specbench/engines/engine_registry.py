"""Every engine, by the name `--engine` takes; each engine is one module here.

Names are known without importing the engine modules; an engine's class is imported on first use, and
importing it imports nothing heavy (its checks run before torch loads). Adding an engine means one new
module and one line in MODULES.
"""

from __future__ import annotations

import functools
import importlib
import json
from typing import TYPE_CHECKING, Any

from specbench.core.engine_names import SPECBENCH
from specbench.core.errors import SpecbenchError

if TYPE_CHECKING:
    from specbench.engines.protocol import Backend, EnginePlan

MODULES = {  # engine name -> module in specbench.engines
    SPECBENCH: "specbench",
    "vllm": "vllm",
    "transformers": "transformers",
}
ALIASES = {"both": (SPECBENCH, "vllm")}
ENGINE_NAMES = tuple(MODULES)
# the engine whose `ar` runs in every run: its greedy outputs are the lossless reference, and its rows are what
# the noise check, the projection and the load axis read
REFERENCE = SPECBENCH


@functools.cache
def backend(name: str) -> type[Backend]:
    """The class an engine module declares as BACKEND."""
    return importlib.import_module(f"specbench.engines.{MODULES[name]}").BACKEND


def choices() -> str:
    """The names --engine takes, each alias after the engines it stands for: `specbench, vllm, both`."""
    names = []
    for name in ENGINE_NAMES:
        names.append(name)
        names += [alias for alias, members in ALIASES.items() if members[-1] == name]
    return ", ".join(names)


def parse_engines(text: str) -> tuple[str, ...]:
    """`--engine`: one engine, an alias or a comma list of them, in the order given, each once."""
    names: list[str] = []
    for part in (p.strip().lower() for p in text.split(",")):
        for name in ALIASES.get(part, (part,)):
            if name not in MODULES:
                raise SpecbenchError(f"--engine {part or text}: expected {choices()}, or a comma list of them")
            if name not in names:
                names.append(name)
    return tuple(names)


def run_order(engines: tuple[str, ...], reference: str) -> tuple[str, ...]:
    """The engines a run starts: the reference first (its `ar` runs in every run), then the listed."""
    return (reference, *(name for name in engines if name != reference))


def check_engines(text: str, plan: EnginePlan) -> tuple[str, ...]:
    """The engines --engine names, each of which has checked the plan; refused in one line before anything loads."""
    engines = parse_engines(text)
    if plan.engine_args and not any(backend(name).takes_engine_args for name in engines):
        owners = [name for name in ENGINE_NAMES if backend(name).takes_engine_args]
        spelled = owners + [alias for alias, members in ALIASES.items() if set(owners) & set(members)]
        titles = " or ".join(backend(name).title for name in owners)
        raise SpecbenchError(f"--engine-args are {titles}'s engine arguments; "
                             f"they need --engine {' or '.join(spelled)}")
    for name in engines:
        backend(name).check(plan)
    return engines


def parse_engine_args(text: str | None) -> dict[str, Any] | None:
    """`--engine-args '{"tensor_parallel_size": 2}'`: a JSON object of the engine's own arguments."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecbenchError(f"--engine-args is not JSON ({exc.msg} at character {exc.pos}); "
                             """give an object such as '{"max_model_len": 2048}'""") from None
    if not isinstance(value, dict):
        raise SpecbenchError(f"--engine-args must be a JSON object of engine arguments, got {text}")
    return value
