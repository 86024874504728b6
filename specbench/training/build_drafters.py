"""`specbench prepare NAME`: a known model converted and its drafters built, once, in the user's cache.

Self-distillation as DeepSpec, EAGLE-3 and SpecForge regenerate their data, at their scale: the target
writes its own instructions and answers them (training/corpus.py; the corpus specbench ships for the
model is read, not made again), one forward per answer keeps the hidden states of the layers any
drafter reads, and each method's drafter is trained on them with the shared trainer, over a reduced
draft vocabulary of the target's most frequent answer tokens. A few corpus prompts are held out of
training and decoded with the drafter as it trains, so a build shows whether it learns.

Everything is resumable and nothing half-written is ever read as a drafter: corpus and hidden-state
chunks are saved as they are made (each file renamed into place), each drafter trains in
`<drafter>.partial/` with checkpoints (training/trainer.py) and appears under its own name only when
finished, and BUILD.json records how each was made. Drafters found there for another target
(another fingerprint) are refused, not silently replaced.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from specbench.core.errors import Interrupted, SpecbenchError
from specbench.core.files import atomic_path, read_json, write_json
from specbench.decoding.linear import bf16_native
from specbench.decoding.model_source import DRAFT, DRAFTERS, KnownModel, preparable
from specbench.decoding.target import fingerprint, load_target, resolve_device
from specbench.methods.base import DRAFTING
from specbench.methods.drafter_dir import WEIGHTS
from specbench.methods.knobs import make_options
from specbench.methods.registry import definition
from specbench.plan.sharegpt import SHAREGPT
from specbench.training.corpus import (
    ConversationSettings,
    CorpusSettings,
    build_conversation_corpus,
    build_corpus,
    build_passage_corpus,
)
from specbench.training.distill import features, pick_layers, split
from specbench.training.held_out import evaluator
from specbench.training.reporter import Reporter
from specbench.training.trainer import train

BUILD = "BUILD.json"  # in the model's drafters/ directory: how each drafter was made
# weights a drafter keeps frozen as its target's own: a shipped drafter leaves them out (the draft LM's tied
# embedding is 28M of its 42M parameters on SmolLM2) and installing it copies them back from the target
TARGETS_OWN = {DRAFT: {"model.embed_tokens.weight": lambda target: target.model.get_input_embeddings().weight}}


@dataclass(frozen=True)
class BuildSettings:
    """How the drafters are made: the corpus, the draft vocabulary and the training recipe."""

    prompts: int = 4096  # corpus samples: instructions the target writes and answers
    passage_tasks: int = 1024  # more: tasks over passages of those answers (summarise, translate, extract ...)
    answer_tokens: int = 128
    conversations: int = 0  # more: turns of users' conversations (`dataset`) with their context, answered by the target
    dataset: str = SHAREGPT  # the packaged ShareGPT, or a file in its layout
    conversation_tokens: int = 256  # the length of those answers: users ask for longer ones
    decode_batch: int = 64  # corpus prompts made and answered together (one saved chunk)
    draft_vocab: int = 8192  # tokens the feature drafters score (0: the target's whole vocabulary)
    steps: int = 2000
    batch_size: int = 8
    max_len: int = 256
    lr: float = 1e-3
    draft_lr: float = 2e-4  # the draft LM starts from the target's own layers: a gentler rate keeps what they know
    evaluate_every: int = 500  # steps between held-out decodes (0: only at the end)
    patience: int = 0  # held-out decodes without a 1% gain in tau that end a training before `steps` (0: never)
    held_out: int = 16  # held-out prompts decoded
    held_out_tokens: int = 64
    seed: int = 0
    rebuild: bool = False  # train every drafter from the corpus even where specbench ships one

    @property
    def corpus(self) -> CorpusSettings:
        return CorpusSettings(samples=self.prompts, answer_tokens=self.answer_tokens, chunk=self.decode_batch,
                              seed=self.seed)

    @property
    def conversation(self) -> ConversationSettings:
        return ConversationSettings(samples=self.conversations, dataset=self.dataset,
                                    answer_tokens=self.conversation_tokens, chunk=self.decode_batch, seed=self.seed)

    def knobs(self, strategy: str) -> dict:
        """What shapes each drafter: the draft vocabulary; EAGLE's training-time test as deep as it drafts."""
        if strategy == DRAFT:
            return {}
        knobs = {"draft_vocab": self.draft_vocab}
        if strategy == "eagle":
            knobs["ttt_steps"] = definition("eagle").options().depth
        return knobs


@dataclass
class Prepared:
    model: KnownModel
    built: list[str]  # the drafters built by this call
    kept: list[str]  # the drafters that were already there
    installed: list[str] = field(default_factory=list)  # the drafters specbench ships, installed by this call
    seconds: dict[str, float] = field(default_factory=dict)  # per stage: corpus, hidden states, each drafter


def prepare_model(name: str, settings: BuildSettings = BuildSettings(), only: tuple[str, ...] = DRAFTERS,
                  report: Reporter = Reporter(), corpus_only: bool = False) -> Prepared:
    """Convert the known model `name` if needed and build every drafter in `only` it does not have yet (with
    `corpus_only`, make the training corpus and stop: the part that takes hours, and that ships)."""
    known = preparable(name)
    unknown = sorted(set(only) - set(DRAFTERS))
    if unknown:
        raise SpecbenchError(f"--only {', '.join(unknown)}: not a trained drafter; trained: {', '.join(DRAFTERS)}")
    started = time.time()
    target = load_target(name, resolve_device("auto"), torch.float32)
    done = Prepared(known, [], [], seconds={"load": round(time.time() - started)})
    mark = fingerprint(target.model)
    done.kept = [s for s in only if _finished(known, s, mark) and not (settings.rebuild and _installed(known, s))]
    todo = [s for s in only if s not in done.kept]
    if not settings.rebuild:
        done.installed = [s for s in todo if install_shipped(known, s, target)]
        todo = [s for s in todo if s not in done.installed]
    if not todo:
        return done
    torch.manual_seed(settings.seed)
    options = {s: make_options(s, settings.knobs(s)) for s in todo}
    models = {s: definition(s).trainable(target, options[s]) for s in todo}
    layers = tuple(sorted({layer for m in models.values() for layer in m.hidden_layers}))
    work = known.home / "build"
    bf16 = bf16_native(target.device)
    try:
        started = time.time()
        corpus = build_corpus(target, work, settings.corpus, mark, _phase(report, "corpus"),
                              known.shipped_corpus)
        training, evaluation = split(corpus)
        tasks = build_passage_corpus(target, work, training, settings.passage_tasks, settings.corpus, mark,
                                     _phase(report, "passage tasks"), known.shipped_corpus)
        training.extend(split(tasks)[0])
        if settings.conversations:
            talks = build_conversation_corpus(target, work, settings.conversation, mark,
                                              _phase(report, "conversations"), known.shipped_corpus)
            training.extend(split(talks)[0])
        done.seconds["corpus"] = round(time.time() - started)
        if corpus_only:
            return done
        started = time.time()
        sequences = features(target, training, layers, work, settings.decode_batch, mark, _phase(report, "features"),
                             settings.max_len)
        done.seconds["features"] = round(time.time() - started)
        for strategy, model in models.items():
            started = time.time()
            evaluations: list[dict] = []
            evaluate = evaluator(target, strategy, options[strategy], evaluation[:settings.held_out],
                                 settings.held_out_tokens, report, evaluations, settings.patience)
            losses = train(model, pick_layers(sequences, layers, tuple(model.hidden_layers)),
                           known.drafter_dir(strategy), strategy, mark, settings.steps, settings.batch_size,
                           settings.draft_lr if strategy == DRAFT else settings.lr, settings.max_len, settings.seed,
                           on_step=_loss(report, f"train {strategy}", settings.steps), decay=True,
                           evaluate=evaluate, evaluate_every=settings.evaluate_every, bf16=bf16)
            done.seconds[strategy] = round(time.time() - started)
            _record(known, strategy, settings, losses, model, done.seconds[strategy], len(sequences), evaluations,
                    bf16)
            done.built.append(strategy)
    except KeyboardInterrupt as exc:
        training_kept = f"; {exc.kept}" if isinstance(exc, Interrupted) else ""
        raise Interrupted(known.home, f"kept in {known.home}: the drafters finished, the corpus and hidden states "
                                      f"saved so far{training_kept}") from exc
    return done


def install_shipped(known: KnownModel, strategy: str, target) -> bool:
    """Copy the drafter specbench ships for `strategy` into the model's home, after checking it was trained
    for this very target, with the weights it shares with the target copied back; False where none is shipped."""
    mark = fingerprint(target.model)
    shipped = known.shipped / "drafters" / strategy
    if not (shipped / "config.json").is_file():
        return False
    found = read_json(shipped / "config.json", "drafter config").get("target_fingerprint")
    if found != mark:
        raise SpecbenchError(f"the {strategy} drafter specbench ships for {known.name} was trained for another "
                             f"conversion of it (fingerprint {found}, this one is {mark}); rebuild it with "
                             f"`specbench prepare {known.name} --rebuild`")
    own = TARGETS_OWN.get(strategy)

    def with_targets_own(weights: dict) -> dict:
        return {**weights, **{name: read(target).detach().to(torch.bfloat16).cpu().contiguous()
                              for name, read in own.items()}}

    _copy_drafter(shipped, known.drafter_dir(strategy), with_targets_own if own else None)
    build = known.shipped / "drafters" / BUILD
    recipe = read_json(build, "build record").get(strategy, {}) if build.is_file() else {}
    _write_record(known.home / "drafters" / BUILD, strategy, {**recipe, "installed_from": str(shipped)})
    return True


def ship(known: KnownModel, strategy: str, drafting: dict | None = None) -> Path:
    """Copy the drafter built in the model's home into what specbench ships for it (known.shipped), with its
    build record and the drafting knobs chosen for it (`drafting`, e.g. by `specbench tune` on the model):
    `specbench prepare` then installs it in minutes. The weights stay bfloat16, the draft vocabulary's head
    rows are the target's and not stored (methods/draft_vocab.py)."""
    built = known.drafter_dir(strategy)
    if not (built / "config.json").is_file():
        raise SpecbenchError(f"no finished {strategy} drafter in {built}: build it with "
                             f"`specbench prepare {known.name} --rebuild --only {strategy}`")
    record = read_json(known.home / "drafters" / BUILD, "build record").get(strategy, {})
    if "installed_from" in record:
        raise SpecbenchError(f"the {strategy} drafter in {built} was installed from what specbench ships, not built")
    destination = known.shipped / "drafters" / strategy
    own = TARGETS_OWN.get(strategy)

    def without_targets_own(weights: dict) -> dict:
        return {name: w for name, w in weights.items() if name not in own}

    _copy_drafter(built, destination, without_targets_own if own else None, {DRAFTING: drafting} if drafting else None)
    _write_record(destination.parent / BUILD, strategy, {**record, DRAFTING: drafting or {}})
    return destination


def record_drafting(known: KnownModel, strategy: str, drafting: dict) -> Path:
    """Record `drafting` (e.g. chosen by `specbench tune` after it shipped) on the drafter specbench already
    ships, in its config.json and build record; its weights stay. Installed again, it drafts so."""
    shipped = known.shipped / "drafters" / strategy
    config = shipped / "config.json"
    if not config.is_file():
        raise SpecbenchError(f"specbench ships no {strategy} drafter for {known.name} to record drafting knobs on")
    write_json(config, {**read_json(config, "drafter config"), DRAFTING: drafting})
    record = read_json(shipped.parent / BUILD, "build record").get(strategy, {})
    _write_record(shipped.parent / BUILD, strategy, {**record, DRAFTING: drafting})
    return shipped


def ship_corpus(known: KnownModel) -> list[Path]:
    """The corpus chunks made in the model's home that specbench does not ship yet, copied into what it ships
    (known.shipped_corpus), each renamed into place: a build then reads them instead of making them."""
    shipped = []
    for chunk in sorted((known.home / "build").glob("*.npz")):
        destination = known.shipped_corpus / chunk.name
        if not destination.is_file():
            destination.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(destination) as tmp:
                shutil.copyfile(chunk, tmp)
            shipped.append(destination)
    return shipped


def _copy_drafter(source: Path, destination: Path, weights: Callable[[dict], dict] | None = None,
                  config: dict | None = None) -> None:
    """A drafter directory copied into place whole or not at all, its weights passed through `weights` where
    given and `config` joining its config.json."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(destination) as tmp:
        shutil.copytree(source, tmp)
        if weights:
            save_file(weights(load_file(str(tmp / WEIGHTS))), str(tmp / WEIGHTS))
        if config:
            write_json(tmp / "config.json", {**read_json(tmp / "config.json", "drafter config"), **config})


def _installed(known: KnownModel, strategy: str) -> bool:
    """The drafter in the model's home was installed from what specbench ships, not built there."""
    path = known.home / "drafters" / BUILD
    return path.is_file() and "installed_from" in read_json(path, "build record").get(strategy, {})


def _phase(report: Reporter, phase: str) -> Callable[[int, int], None]:
    return lambda done, total: report.progress(phase, done, total, "")


def _loss(report: Reporter, phase: str, steps: int) -> Callable[[int, float], None]:
    return lambda step, loss: report.progress(phase, step, steps, f"loss {loss:.3f}")


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


def _record(known: KnownModel, strategy: str, settings: BuildSettings, losses: list[float], model, seconds: float,
            sequences: int, evaluations: list[dict], bf16: bool) -> None:
    _write_record(known.home / "drafters" / BUILD, strategy, {
        **asdict(settings), "knobs": settings.knobs(strategy), "training_sequences": sequences, "bf16": bf16,
        "steps_trained": len(losses), "first_loss": losses[0], "final_loss": sum(losses[-10:]) / len(losses[-10:]),
        "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "train_seconds": round(seconds), "held_out": evaluations})


def _write_record(path: Path, strategy: str, entry: dict) -> None:
    """`strategy`'s entry of the build record at `path` (the model's home or what specbench ships)."""
    record = read_json(path, "build record") if path.is_file() else {}
    record[strategy] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record)
