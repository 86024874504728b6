"""`specbench train`: self-distil a drafter from its target."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from specbench.cli.app import app, out, progress_bar, user_errors
from specbench.errors import SpecbenchError


@app.command()
def train(
    strategy: Annotated[str, typer.Option(help="eagle, mtp, dflash or dspark.")],
    prompts: Annotated[str, typer.Option(help="Suite name or file with the training prompts.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Drafter directory to write.")],
    model: Annotated[Optional[str], typer.Option(help="Target: HF id or local directory (default: embedded).")] = None,
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 300,
    batch_size: Annotated[int, typer.Option()] = 8,
    lr: Annotated[float, typer.Option()] = 1e-3,
    max_new_tokens: Annotated[int, typer.Option(help="Length of the regenerated answers.")] = 128,
    limit: Annotated[Optional[int], typer.Option(help="Use at most N prompts.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="A drafter knob, e.g. --set dflash.block_size=8.")] = None,
    device: Annotated[str, typer.Option()] = "auto",
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Train a drafter against a target by self-distillation (resumes an interrupted training)."""
    from specbench.strategies.knobs import parse_sets
    from specbench.training.run import train_drafter

    with user_errors(), progress_bar() as bar:
        knobs = parse_sets(set_ or [])
        extra = set(knobs) - {strategy}
        if extra:
            raise SpecbenchError(f"--set for {', '.join(sorted(extra))} does not apply to training {strategy}")
        tasks: dict[str, int] = {}

        def advance(phase: str, done: int, total: int, loss: float | None) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total, detail="")
            bar.update(tasks[phase], completed=done, detail=f"loss {loss:.3f}" if loss is not None else "")

        result = train_drafter(strategy, prompts, out_dir, model, steps, batch_size, lr, max_new_tokens, limit,
                               knobs.get(strategy), device, seed, advance)
    out.print(f"{result.strategy} drafter: {result.out_dir} ({result.prompts} prompts, {result.steps} steps, "
              f"loss {result.first_loss:.3f} -> {result.final_loss:.3f})", highlight=False)
