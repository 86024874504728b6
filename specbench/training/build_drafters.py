"""`specbench prepare NAME`: a known model converted and its drafters built, once, in the user's cache.

Self-distillation as DeepSpec and EAGLE-3 regenerate their data: the target answers training prompts
made for the purpose (training/chat_prompts.py, disjoint from every suite specbench measures on),
the hidden states of the layers any drafter reads are kept, and each method's drafter is trained on
them with the shared trainer. Everything is resumable and nothing half-written is ever read as a
drafter: the target's answers are saved chunk by chunk (each file renamed into place), each drafter
trains in `<drafter>.partial/` with checkpoints (training/trainer.py) and appears under its own name
only when finished, and BUILD.json records how each was made. Drafters found there for another
target (another fingerprint) are refused, not silently replaced.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from specbench.core.errors import Interrupted, SpecbenchError
from specbench.core.files import atomic_path, read_json, write_json
from specbench.model_source import DRAFT, DRAFTERS, KnownModel, preparable
from specbench.models import fingerprint, load_target, resolve_device
from specbench.strategies.registry import definition
from specbench.training.chat_prompts import chat_prompts
from specbench.training.distill import DistillSequence, collect, pick_layers
from specbench.training.trainer import train

BUILD = "BUILD.json"  # in the model's drafters/ directory: how each drafter was made
Progress = Callable[[str, int, int, float | None], None]  # phase, done, total, loss


@dataclass(frozen=True)
class BuildSettings:
    """How the drafters are made. On two CPU cores the target's answers take minutes (20 s per 16 prompts
    when quiet) and training takes hours: measured 2026-12-02, DFlash ran about 14 s a step on two shared
    cores, so five drafters of 200 steps are two to three hours there. A GPU is used where there is one."""

    prompts: int = 192
    answer_tokens: int = 96
    steps: int = 200
    batch_size: int = 4
    max_len: int = 160
    lr: float = 1e-3
    draft_lr: float = 2e-4  # the draft LM starts from the target's own layers: a gentler rate keeps what they know
    decode_batch: int = 16  # prompts answered together while distilling (the same greedy answers, faster)
    seed: int = 0


@dataclass
class Prepared:
    model: KnownModel
    built: list[str]  # the drafters built by this call
    kept: list[str]  # the drafters that were already there
    seconds: dict[str, float]  # per stage: distil and each drafter built


def prepare_model(name: str, settings: BuildSettings = BuildSettings(), only: tuple[str, ...] = DRAFTERS,
                  progress: Progress | None = None) -> Prepared:
    """Convert the known model `name` if needed and build every drafter in `only` it does not have yet."""
    known = preparable(name)
    unknown = sorted(set(only) - set(DRAFTERS))
    if unknown:
        raise SpecbenchError(f"--only {', '.join(unknown)}: not a trained drafter; trained: {', '.join(DRAFTERS)}")
    started = time.time()
    target = load_target(name, resolve_device("auto"), torch.float32)
    seconds = {"load": round(time.time() - started)}
    mark = fingerprint(target.model)
    kept = [s for s in only if _finished(known, s, mark)]
    todo = [s for s in only if s not in kept]
    if not todo:
        return Prepared(known, [], kept, seconds)
    torch.manual_seed(settings.seed)
    models = {s: definition(s).trainable(target, definition(s).options()) for s in todo}
    layers = tuple(sorted({layer for m in models.values() for layer in m.hidden_layers}))
    try:
        started = time.time()
        sequences = distilled(target, known.home / "build", settings, layers, mark, progress)
        seconds["distil"] = round(time.time() - started)
        for strategy, model in models.items():
            started = time.time()
            data = pick_layers(sequences, layers, tuple(model.hidden_layers))
            losses = train(model, data, known.drafter_dir(strategy), strategy, mark, settings.steps,
                           settings.batch_size, settings.draft_lr if strategy == DRAFT else settings.lr,
                           settings.max_len, settings.seed,
                           on_step=(lambda s, loss, p=f"train {strategy}": progress(p, s, settings.steps, loss))
                           if progress else None)
            seconds[strategy] = round(time.time() - started)
            _record(known, strategy, settings, losses, model, seconds[strategy])
    except KeyboardInterrupt as exc:
        training = f"; {exc.kept}" if isinstance(exc, Interrupted) else ""
        raise Interrupted(known.home, f"kept in {known.home}: the drafters finished, the target's answers saved so "
                                      f"far{training}") from exc
    return Prepared(known, todo, kept, seconds)


def _finished(known: KnownModel, strategy: str, mark: str) -> bool:
    """The drafter is there and was built for this target; one built for another is refused."""
    path = known.drafter_dir(strategy)
    if not (path / "config.json").is_file():
        return False
    found = read_json(path / "config.json", "drafter config").get("target_fingerprint")
    if found != mark:
        raise SpecbenchError(f"{path} holds a {strategy} drafter built for another model (fingerprint {found}, "
                             f"{known.name} is {mark}); remove it and run `specbench prepare {known.name}` again")
    return True


def distilled(target, work: Path, settings: BuildSettings, layers: tuple[int, ...], mark: str,
              progress: Progress | None = None) -> list[DistillSequence]:
    """The target's answers to the training prompts with the hidden states of `layers`, collected
    `decode_batch` prompts at a time into work/distil-NNNN.pt; chunks already saved are read back."""
    prompts = chat_prompts(settings.prompts, settings.seed)
    key = {"target": mark, "layers": list(layers), "answer_tokens": settings.answer_tokens}
    work.mkdir(parents=True, exist_ok=True)
    sequences: list[DistillSequence] = []
    size = settings.decode_batch
    for start in range(0, len(prompts), size):
        chunk = prompts[start:start + size]
        path = work / f"distil-{start // size:04d}.pt"
        saved = torch.load(path, weights_only=False) if path.is_file() else None
        if saved is None or saved["key"] != {**key, "prompts": chunk}:
            saved = {"key": {**key, "prompts": chunk},
                     "sequences": collect(target, chunk, layers, settings.answer_tokens, batch_size=size)}
            with atomic_path(path) as tmp:
                torch.save(saved, tmp)
        sequences += saved["sequences"]
        if progress:
            progress("distil", len(sequences), len(prompts), None)
    return sequences


def _record(known: KnownModel, strategy: str, settings: BuildSettings, losses: list[float], model, seconds: float):
    path = known.home / "drafters" / BUILD
    record = read_json(path, "build record") if path.is_file() else {}
    record[strategy] = {**asdict(settings), "first_loss": losses[0],
                        "final_loss": sum(losses[-10:]) / len(losses[-10:]),
                        "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
                        "train_seconds": round(seconds)}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record)
