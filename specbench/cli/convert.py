"""`specbench convert`: a published drafter checkpoint into specbench's own format, and back."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from specbench.cli.app import app, out, user_errors


@app.command()
def convert(
    source: Annotated[str, typer.Argument(help="Drafter checkpoint: a local directory or a hub id.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write the converted drafter to.")],
    model: Annotated[Optional[str], typer.Option(help="The target it drafts for: HF id or local directory (default: the embedded model).")] = None,
    mask_token_id: Annotated[Optional[int], typer.Option(help="specbench dspark -> DeepSpec: the vocabulary row that holds the mask vector (default: a row the tokenizer never produces).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a line.")] = False,
) -> None:
    """Convert a drafter exactly: z-lab DFlash or DeepSpec DSpark -> specbench, specbench dspark -> DeepSpec."""
    from specbench.model_source import model_path
    from specbench.ranges import check_range
    from specbench.strategies.published.formats import open_source

    with user_errors():
        check_range("--mask-token-id", mask_token_id)
        checkpoint = open_source(source)  # a bad checkpoint or --model is refused before torch is imported
        model_path(model)

        import torch

        from specbench.models import load_target
        from specbench.strategies.published.convert import convert as convert_drafter

        target = load_target(model, torch.device("cpu"), torch.float32)
        done = convert_drafter(checkpoint, target, out_dir, mask_token_id)
    if as_json:
        sys.stdout.write(json.dumps(done.as_json(), indent=2) + "\n")
        return
    out.print(f"{done.source} ({done.source_format}) -> {done.out} ({done.out_format}); " + "; ".join(done.notes),
              highlight=False)
