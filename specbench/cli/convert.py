"""`specbench convert`: a published drafter checkpoint into specbench's own format, and back."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from specbench.cli import options
from specbench.cli.app import app, out, user_errors
from specbench.core.errors import SpecbenchError


@app.command()
def convert(
    source: Annotated[str, typer.Argument(help="Drafter checkpoint: a local directory or a hub id.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write the converted drafter to.")],
    model: options.Model = None,
    to: Annotated[Optional[str], typer.Option("--to", help="'vllm': a specbench drafter into the layout vLLM's method for it loads (eagle -> eagle3, dflash -> dflash, dspark -> dspark).")] = None,
    mask_token_id: Annotated[Optional[int], typer.Option(help="specbench dflash/dspark -> z-lab/DeepSpec/vLLM: the vocabulary row that holds the mask vector (default: a row the tokenizer never produces).")] = None,
    as_json: options.Json = False,
) -> None:
    """Convert a drafter exactly: z-lab DFlash or DeepSpec DSpark -> specbench, specbench dspark -> DeepSpec,
    and with --to vllm a specbench drafter -> the layout vLLM loads."""
    from specbench.core.ranges import check_range
    from specbench.decoding.model_source import model_path
    from specbench.methods.published.formats import open_source

    with user_errors():
        check_range("--mask-token-id", mask_token_id)
        if to not in (None, "vllm"):
            raise SpecbenchError(f"--to {to}: the one target layout is 'vllm' (without --to, the direction follows "
                                 "from the drafter's format)")
        if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
            raise SpecbenchError(f"--out {out_dir} exists and is not empty; give a new directory for the converted "
                                 "drafter")
        checkpoint = open_source(source)  # a bad checkpoint or --model is refused before torch is imported
        model_path(model)

        import torch

        from specbench.decoding.target import load_target
        from specbench.methods.published.conversion import convert as convert_drafter
        from specbench.methods.published.to_vllm import to_vllm

        target = load_target(model, torch.device("cpu"), torch.float32)
        write = to_vllm if to == "vllm" else convert_drafter
        done = write(checkpoint, target, out_dir, mask_token_id)
    if as_json:
        sys.stdout.write(json.dumps(done.as_json(), indent=2) + "\n")
        return
    out.print(f"{done.source} ({done.source_format}) -> {done.out} ({done.out_format}); " + "; ".join(done.notes),
              highlight=False)
