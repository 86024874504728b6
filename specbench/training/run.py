"""`specbench train`: self-distil a drafter from a target over a prompt suite."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from specbench.errors import SpecbenchError
from specbench.models import fingerprint, load_target, resolve_device, resolve_dtype
from specbench.strategies.knobs import make_options
from specbench.strategies.registry import definitions
from specbench.suites import load_suite, select
from specbench.training.distill import collect
from specbench.training.trainer import partial_dir, train

Progress = Callable[[str, int, int, float | None], None]  # phase, done, total, loss


@dataclass
class TrainResult:
    out_dir: Path
    strategy: str
    steps: int
    prompts: int
    first_loss: float
    final_loss: float


def trainable_strategies() -> list[str]:
    return [name for name, d in definitions().items() if d.trainable is not None]


def train_drafter(strategy: str, prompts: str | Path, out_dir: Path, model: str | None = None,
                  steps: int = 300, batch_size: int = 8, lr: float = 1e-3, max_new_tokens: int = 128,
                  limit: int | None = None, knobs: dict[str, Any] | None = None, device: str = "auto",
                  seed: int = 0, progress: Progress | None = None) -> TrainResult:
    if strategy not in trainable_strategies():
        raise SpecbenchError(f"strategy {strategy!r} cannot be trained; trainable: {', '.join(trainable_strategies())}")
    if steps < 1 or batch_size < 1 or max_new_tokens < 1:
        raise SpecbenchError("--steps, --batch-size and --max-new-tokens must be at least 1")
    suite = select(load_suite(prompts), limit=limit)
    torch.manual_seed(seed)
    dev = resolve_device(device)
    target = load_target(model, dev, resolve_dtype("float32", dev))
    options = make_options(strategy, knobs or {})
    drafter = definitions()[strategy].trainable(target, options).to(dev)
    work = partial_dir(out_dir)
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "distill.pt"
    key = {"prompts": [list(i.turns) for i in suite.items], "layers": list(drafter.hidden_layers),
           "max_new_tokens": max_new_tokens, "target": fingerprint(target.model)}
    sequences = None
    if cache.exists():
        saved = torch.load(cache, weights_only=False)
        sequences = saved["sequences"] if saved["key"] == key else None
    if sequences is None:
        done = 0

        def tick() -> None:
            nonlocal done
            done += 1
            if progress:
                progress("distil", done, len(suite.items), None)

        sequences = collect(target, key["prompts"], drafter.hidden_layers, max_new_tokens, tick)
        torch.save({"key": key, "sequences": sequences}, cache)
    losses = train(drafter, sequences, out_dir, strategy, key["target"], steps, batch_size, lr, seed=seed,
                   on_step=(lambda s, loss: progress("train", s, steps, loss)) if progress else None)
    return TrainResult(Path(out_dir), strategy, steps, len(sequences), losses[0], sum(losses[-10:]) / len(losses[-10:]))
