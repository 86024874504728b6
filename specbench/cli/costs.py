"""`specbench costs`: measure (or reuse) the forward-cost table of a target and its drafters."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from specbench.cli.app import app, err, out, print_table, progress_bar, size_list, split_list, user_errors


@app.command()
def costs(
    model: Annotated[Optional[str], typer.Option(help="HF model id or local directory (default: the embedded model).")] = None,
    drafter: Annotated[Optional[list[str]], typer.Option(help="Drafter (a directory or a hub id) whose proposals to time (repeatable).")] = None,
    strategy: Annotated[Optional[list[str]], typer.Option("--strategy", "-s", help="Time only these drafters (comma list; default: every drafter the model has).")] = None,
    batch_sizes: Annotated[Optional[str], typer.Option(help="Batch sizes, increasing (default 1,2,4,8,16,32).")] = None,
    verify_lengths: Annotated[Optional[str], typer.Option(help="Tokens per verify forward, increasing (default 1,2,4,8,16).")] = None,
    context_lens: Annotated[Optional[str], typer.Option(help="Cached context lengths, increasing (default 128,1024).")] = None,
    repeats: Annotated[Optional[int], typer.Option(help="Timed repeats per entry (the median is kept; default 5).")] = None,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16 or float16.")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    out_dir: Annotated[str, typer.Option("--out", help="Results directory; the table goes to OUT/costs/.")] = "results",
    as_json: Annotated[bool, typer.Option("--json", help="Print the table as one JSON object.")] = False,
) -> None:
    """Time target forwards by batch size, verify length and context, and each drafter's proposal.

    Entries already stored for this model, device, dtype and torch version are reused, not timed again.
    """
    from dataclasses import replace

    from specbench.measure.cost_table import BATCH_GRID
    from specbench.paths import check_output_dir
    from specbench.ranges import check_device, check_dtype

    with user_errors():
        # every check that needs no torch comes first: a bad input is refused at once
        grid = replace(BATCH_GRID, **{k: v for k, v in {
            "batch_sizes": size_list(batch_sizes, "--batch-sizes"),
            "verify_lengths": size_list(verify_lengths, "--verify-lengths"),
            "context_lens": size_list(context_lens, "--context-lens"),
            "repeats": repeats}.items() if v is not None})
        grid.check()
        check_dtype(dtype)
        check_device(device)
        check_output_dir(out_dir, "--out")

        from specbench.batch_tables import cost_frames, render_frame
        from specbench.measure.costs import measure_target_costs
        from specbench.models import load_target, resolve_device, resolve_dtype
        from specbench.strict_json import dumps

        torch_device = resolve_device(device)
        target = load_target(model, torch_device, resolve_dtype(dtype, torch_device))
        if context_lens is None:
            grid = grid.within(getattr(target.model.config, "max_position_embeddings", None))
        with progress_bar() as bar:
            task = bar.add_task("costs", total=None, detail="")

            def advance(what: str, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, detail=what)

            table, path = measure_target_costs(target, list(drafter or []), out_dir, grid, split_list(strategy), advance)
    if as_json:
        sys.stdout.write(dumps({"path": str(path), **table.as_json()}, indent=2) + "\n")
        return
    for title, frame in cost_frames(table).items():
        print_table(render_frame(frame, title, markdown=not out.is_terminal))
    err.print(f"cost table: {path}", highlight=False)
