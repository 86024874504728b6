"""Each strategy's `vllm serve` arguments: the same translation and drafter conversion as `--engine vllm`.

The only place serving reads the in-process vLLM engine's module: its translation of a strategy to a
speculative_config, its drafter conversion (done once, cached) and its engine-argument defaults, so a
strategy is configured identically whether vLLM runs it in process or behind a server.
"""

from __future__ import annotations

from typing import Any

from specbench.engines import vllm as vllm_backend
from specbench.plan.run_config import RunPlan

# KV-cache memory of a CPU server beyond its target's own need: a drafter's cache and whole blocks
KV_CACHE_MARGIN = 2


def kv_cache_bytes(model_config, dtype_bytes: int, tokens: int) -> int:
    """The bytes of keys and values of `tokens` tokens of the target, times KV_CACHE_MARGIN."""
    heads = getattr(model_config, "num_key_value_heads", None) or model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
    return KV_CACHE_MARGIN * tokens * 2 * model_config.num_hidden_layers * heads * head_dim * dtype_bytes


def server_arguments(plan: RunPlan, target_loader, kv_tokens: int | None = None) -> dict[str, dict[str, Any]]:
    """Strategy name -> the engine arguments of its server (`ar`: no speculative_config). A knob vLLM has
    no counterpart for is refused before anything starts; `target_loader()` gives the loaded target, only
    called where a drafter is converted to vLLM's layout. On a CPU, `kv_tokens` (the tokens the levels keep
    in flight at once) sizes the KV cache instead of the in-process engine's fixed 1 GiB (without either,
    vLLM's CPU backend reserves 92% of the machine's memory and refuses to start when anything else holds
    more than 8% of it); --engine-args' kv_cache_memory_bytes or gpu_memory_utilization win, and vLLM
    itself lets VLLM_CPU_KVCACHE_SPACE win over all."""
    from transformers import AutoConfig

    from specbench.decoding.target import resolve_device, resolve_dtype

    config, sources = plan.config, plan.drafter_sources
    strategies = [vllm_backend.translate(s, config.knobs, config.controller, sources) for s in plan.strategies]
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    # vLLM's defaults, as deployed (it compiles; CUDA graphs on a GPU); the server's output is its own log
    base = vllm_backend.engine_kwargs(plan.model, dtype, config.seed, config.engine_args,
                                      log=False)
    if "disable_log_stats" not in config.engine_args:
        base.pop("disable_log_stats")  # a server logs its stats unless told not to
    model_config = AutoConfig.from_pretrained(plan.model)
    limit = getattr(model_config, "max_position_embeddings", None)
    base.setdefault("max_model_len", min(limit, vllm_backend.MAX_MODEL_LEN) if limit else vllm_backend.MAX_MODEL_LEN)
    if device.type == "cpu" and "kv_cache_memory_bytes" not in config.engine_args:
        if "gpu_memory_utilization" in config.engine_args:  # the fraction of memory the user gave
            base.pop("kv_cache_memory_bytes", None)
        elif kv_tokens is not None:  # at least one request of max_model_len tokens, which vLLM insists on
            tokens = max(kv_tokens, base["max_model_len"])
            base["kv_cache_memory_bytes"] = kv_cache_bytes(model_config, dtype.itemsize, tokens)
    arguments = {}
    for spec, strategy in zip(plan.strategies, strategies, strict=True):
        if strategy.speculative_config and "model" in strategy.speculative_config:
            target = target_loader()  # translated again with the drafter's own knobs under the user's
            strategy = vllm_backend.translate(spec, config.knobs, config.controller, sources, target)
            strategy = vllm_backend.with_drafter(strategy, sources, target, vllm_backend.drafter_cache())
        arguments[strategy.name] = ({**base, "speculative_config": strategy.speculative_config}
                                    if strategy.speculative_config else dict(base))
    return arguments
