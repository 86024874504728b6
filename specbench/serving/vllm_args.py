"""Each strategy's `vllm serve` arguments: the same translation and drafter conversion as `--engine vllm`.

The only place serving reads the in-process vLLM engine's module: its translation of a strategy to a
speculative_config, its drafter conversion (done once, cached) and its engine-argument defaults, so a
strategy is configured identically whether vLLM runs it in process or behind a server.
"""

from __future__ import annotations

from typing import Any

from specbench.backends import vllm as vllm_backend
from specbench.config import RunConfig


def server_arguments(config: RunConfig, target_loader) -> dict[str, dict[str, Any]]:
    """Strategy name -> the engine arguments of its server (`ar`: no speculative_config). A knob vLLM has
    no counterpart for is refused before anything starts; `target_loader()` gives the loaded target, only
    called where a drafter is converted to vLLM's layout."""
    from transformers import AutoConfig

    from specbench.models import resolve_device, resolve_dtype

    plan = config.plan()
    config, sources = plan.config, plan.drafter_sources
    strategies = [vllm_backend.translate(s, config.knobs, config.controller, sources) for s in plan.strategies]
    dtype = resolve_dtype(config.dtype, resolve_device(config.device))
    # vLLM's defaults, as deployed (it compiles; CUDA graphs on a GPU); the server's output is its own log
    base = vllm_backend.engine_kwargs(plan.model, dtype, config.seed, config.engine_args,
                                      log=False)
    if "disable_log_stats" not in config.engine_args:
        base.pop("disable_log_stats")  # a server logs its stats unless told not to
    limit = getattr(AutoConfig.from_pretrained(plan.model), "max_position_embeddings", None)
    base.setdefault("max_model_len", min(limit, vllm_backend.MAX_MODEL_LEN) if limit else vllm_backend.MAX_MODEL_LEN)
    arguments = {}
    for strategy in strategies:
        if strategy.speculative_config and "model" in strategy.speculative_config:
            strategy = vllm_backend.with_drafter(strategy, sources, target_loader(), vllm_backend.drafter_cache())
        arguments[strategy.name] = ({**base, "speculative_config": strategy.speculative_config}
                                    if strategy.speculative_config else dict(base))
    return arguments
