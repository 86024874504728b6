"""`specbench train`: self-distil a drafter from a target, over a prompt suite or over instructions the
target writes itself (training/corpus.py, the recipe `specbench prepare` uses, held-out decodes included)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.core.errors import Interrupted, SpecbenchError
from specbench.core.files import atomic_path
from specbench.decoding.linear import bf16_native
from specbench.decoding.target import fingerprint, load_target, resolve_device, resolve_dtype
from specbench.methods.knobs import make_options
from specbench.methods.registry import definitions
from specbench.plan.sharegpt import read_conversations
from specbench.training.corpus import (
    ConversationSettings,
    Corpus,
    CorpusSettings,
    build_conversation_corpus,
    build_corpus,
    build_passage_corpus,
)
from specbench.training.distill import DistillSequence, collect, features, split
from specbench.training.held_out import evaluator
from specbench.training.reporter import Reporter
from specbench.training.settings import TrainSettings, partial_dir
from specbench.training.trainer import MAX_LEN, train

HELD_OUT = 16  # held-out prompts decoded as a synthesised training goes


@dataclass
class TrainResult:
    out_dir: Path
    strategy: str
    steps: int
    prompts: int
    first_loss: float
    final_loss: float
    held_out: dict | None = None  # the last held-out decode (step, tau, acceptance): with --synthesise


def trainable_strategies() -> list[str]:
    return [name for name, d in definitions().items() if d.trainable is not None]


def train_drafter(settings: TrainSettings, report: Reporter = Reporter()) -> TrainResult:
    """Check the settings, regenerate the target's answers (cached), train, and save the drafter.

    An interrupted training resumes from OUT.partial when run again with the same settings; on
    KeyboardInterrupt, `Interrupted` says what was kept there.
    """
    suite = settings.check()
    strategy = settings.strategy
    if strategy not in trainable_strategies():
        raise SpecbenchError(f"strategy {strategy!r} cannot be trained; trainable: {', '.join(trainable_strategies())}")
    options = make_options(strategy, settings.knobs.get(strategy, {}))
    torch.manual_seed(settings.seed)
    dev = resolve_device(settings.device)
    target = load_target(settings.model, dev, resolve_dtype("float32", dev))
    drafter = definitions()[strategy].trainable(target, options).to(dev)
    work = partial_dir(settings.out_dir)
    if settings.unfinished_differs():  # only reached with --force: check() refuses it otherwise
        shutil.rmtree(work)
    mark = fingerprint(target.model)
    evaluations: list[dict] = []
    if suite is None:
        settings.record()
        training, evaluation = made_corpus(target, settings, work, mark, report)
        sequences = features(target, training, drafter.hidden_layers, work, CorpusSettings.chunk, mark,
                             lambda done, total: report.progress("features", done, total, ""), MAX_LEN)
        evaluate = evaluator(target, strategy, options, evaluation[:HELD_OUT], settings.max_new_tokens, report,
                             evaluations)
    else:
        sequences, evaluate = answers(target, suite, drafter.hidden_layers, settings, work, report), None
    steps = settings.steps
    try:
        losses = train(drafter, sequences, settings.out_dir, strategy, mark, steps, settings.batch_size,
                       settings.lr, seed=settings.seed, decay=True, evaluate=evaluate, bf16=bf16_native(target.device),
                       on_step=lambda s, loss: report.progress("train", s, steps, f"loss {loss:.3f}"))
    except Interrupted as exc:
        raise Interrupted(work, f"kept in {work}: the target's answers to {len(sequences)} prompts and "
                                f"{exc.kept}") from exc
    except KeyboardInterrupt as exc:  # before the first step
        raise Interrupted(work, f"kept in {work}: the target's answers to {len(sequences)} prompts") from exc
    return TrainResult(Path(settings.out_dir), strategy, steps, len(sequences), losses[0],
                       sum(losses[-10:]) / len(losses[-10:]), evaluations[-1] if evaluations else None)


def made_corpus(target, settings: TrainSettings, work: Path, mark: str,
                report: Reporter) -> tuple[Corpus, list[list[int]]]:
    """The training part and the held-out prompts of the corpus the target answers: instructions it writes
    itself with tasks over their answers (as `prepare` makes them), or turns of users' conversations."""
    if settings.dataset:
        samples = settings.limit or len(read_conversations(settings.dataset).conversations)
        talks = ConversationSettings(samples=samples, dataset=settings.dataset, answer_tokens=settings.max_new_tokens,
                                     chunk=min(ConversationSettings.chunk, samples), seed=settings.seed)
        return split(build_conversation_corpus(target, work, talks, mark,
                                               lambda done, total: report.progress("conversations", done, total, "")))
    corpus_settings = CorpusSettings(samples=settings.synthesise, answer_tokens=settings.max_new_tokens,
                                     chunk=min(CorpusSettings.chunk, settings.synthesise), seed=settings.seed)
    corpus = build_corpus(target, work, corpus_settings, mark,
                          lambda done, total: report.progress("corpus", done, total, ""))
    training, evaluation = split(corpus)
    # a quarter more samples of tasks over passages of those answers
    tasks = build_passage_corpus(target, work, training, settings.synthesise // 4, corpus_settings, mark,
                                 lambda done, total: report.progress("passage tasks", done, total, ""))
    training.extend(split(tasks)[0])
    return training, evaluation


def answers(target, suite, layers: tuple[int, ...], settings: TrainSettings, work: Path,
            report: Reporter) -> list[DistillSequence]:
    """The target's answers to the suite's prompts with its hidden states, cached in work/distill.pt."""
    cache = work / "distill.pt"
    key = {"prompts": [list(i.turns) for i in suite.items], "layers": list(layers),
           "max_new_tokens": settings.max_new_tokens, "target": fingerprint(target.model)}
    sequences = None
    if cache.exists():
        saved = torch.load(cache, weights_only=False)
        sequences = saved["sequences"] if saved["key"] == key else None
    if sequences is None:
        done = 0

        def tick() -> None:
            nonlocal done
            done += 1
            report.progress("distil", done, len(suite.items), "")

        sequences = collect(target, key["prompts"], layers, settings.max_new_tokens, tick)
        settings.record()
        with atomic_path(cache) as tmp:
            torch.save({"key": key, "sequences": sequences}, tmp)
    return sequences
