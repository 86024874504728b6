"""The drafters' training data at scale without a data set: instructions the target writes itself and
its own greedy answers to them, kept as token ids.

Instructions come from Magpie (Xu et al., arXiv 2406.08464): an aligned model given its chat template
up to the start of a user turn writes a plausible user request. They are sampled at temperature 1,
kept only when the model closed the turn itself, deduplicated, filtered by length and refused where
they share a word sequence with a suite specbench measures on; a share of the written request forms
of training/chat_prompts.py is mixed in for the kinds (code, arithmetic, extraction) a small model
rarely asks for. The target then answers every instruction greedily, as decoding it later will
(decoding/batch.py: each the answer it gets alone), so a drafter learns the very text it must predict.
Its answers then become passages of further tasks it answers too (summarise, translate, extract: the
copying from a prompt that short instructions never ask for).

The work is done in chunks, each saved as it is finished (renamed into place), so a build that is
stopped resumes at its first missing chunk. Chunks are compressed token ids, small enough to ship with the
package (`scripts/ship_drafters.py --corpus`): a build reads shipped chunks instead of making them.
"""

from __future__ import annotations

import json
import random
import re
import zipfile
import zlib
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from specbench.core.errors import SpecbenchError
from specbench.core.files import atomic_path
from specbench.decoding.batch import generate_batch
from specbench.decoding.sampling import Sampling, seeded
from specbench.decoding.target import Target, encode_turns
from specbench.plan.sharegpt import SHAREGPT, Read, dataset_path, read_conversations
from specbench.plan.suites import builtin_suite_names, load_suite
from specbench.training.chat_prompts import chat_prompts, overlapping, passage, passage_prompts, word_sequences

Progress = Callable[[int, int], None]  # samples done, total


@dataclass(frozen=True)
class CorpusSettings:
    samples: int = 4096  # made in whole chunks
    written_share: float = 0.25  # the rest synthesised by the target (Magpie)
    instruction_tokens: int = 64  # an instruction still open after this many tokens is dropped
    min_words: int = 4
    answer_tokens: int = 128
    chunk: int = 64  # instructions synthesised and answered together, and saved as one file
    temperature: float = 1.0  # Magpie's setting for instructions
    top_p: float = 0.95
    seed: int = 0


@dataclass
class Corpus:
    """Prompt ids (the chat template around one user turn) and the target's greedy answer ids."""

    prompts: list[list[int]]
    answers: list[list[int]]

    def __len__(self) -> int:
        return len(self.prompts)

    def extend(self, other: Corpus) -> None:
        self.prompts += other.prompts
        self.answers += other.answers


def save_corpus(path: Path, corpus: Corpus, meta: dict) -> None:
    """One compressed .npz of uint16 token ids (int32 past 65,535 ids) and the lengths that split them."""
    top = max((max(s, default=0) for s in corpus.prompts + corpus.answers), default=0)
    dtype = np.uint16 if top < 2**16 else np.int32
    tokens = np.fromiter((t for p, a in zip(corpus.prompts, corpus.answers) for t in p + a), dtype=dtype)
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.savez_compressed(handle, tokens=tokens, prompt_lengths=np.array([len(p) for p in corpus.prompts]),
                            answer_lengths=np.array([len(a) for a in corpus.answers]),
                            meta=np.array(json.dumps(meta, sort_keys=True)))


def load_corpus(path: Path) -> tuple[Corpus, dict]:
    """A corpus written by `save_corpus` and its metadata; one line where the file is not one."""
    try:
        with np.load(path, allow_pickle=False) as data:
            tokens = data["tokens"].astype(np.int64)
            prompt_lengths, answer_lengths = data["prompt_lengths"], data["answer_lengths"]
            meta = json.loads(str(data["meta"]))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise SpecbenchError(f"{path} is not a specbench training corpus ({exc})") from None
    if int(prompt_lengths.sum() + answer_lengths.sum()) != len(tokens):
        raise SpecbenchError(f"{path} is damaged: its lengths do not add up to its tokens")
    corpus, at = Corpus([], []), 0
    for p, a in zip(prompt_lengths.tolist(), answer_lengths.tolist()):
        corpus.prompts.append(tokens[at:at + p].tolist())
        corpus.answers.append(tokens[at + p:at + p + a].tolist())
        at += p + a
    return corpus, meta


def user_turn_prefix(tokenizer) -> list[int]:
    """The chat template up to where a user's words begin (Magpie's pre-query template)."""
    marker = "\u2063specbench\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    return tokenizer(text[:text.index(marker)], add_special_tokens=False)["input_ids"]


def _normal(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def synthesise(target: Target, count: int, settings: CorpusSettings, seed: int, seen: set[str],
               suite_words: frozenset) -> list[str]:
    """`count` new instructions written by the target after its user-turn prefix (fewer where too many
    candidates fail the filters; none without a chat template), each closed by the model itself, of
    `min_words` words at least, not in `seen` (which is updated) and sharing no word sequence with the suites
    (`suite_words`, chat_prompts.word_sequences)."""
    if not getattr(target.tokenizer, "chat_template", None):
        return []
    prefix = user_turn_prefix(target.tokenizer)
    sampling = Sampling(temperature=settings.temperature, top_p=settings.top_p)
    found: list[str] = []
    for attempt in range(8):
        want = 2 * (count - len(found))
        rngs = [seeded(seed * 1_000_003 + attempt * 10_007 + i, target.device) for i in range(want)]
        out = generate_batch(target.model, [prefix] * want, settings.instruction_tokens, sampling,
                             eos_ids=target.eos_ids, rngs=rngs)
        for generation in out.sequences:
            if not generation.tokens or generation.tokens[-1] not in target.eos_ids:
                continue  # still open at the token limit, or empty
            text = target.tokenizer.decode(generation.tokens[:-1], skip_special_tokens=True).strip()
            key = _normal(text)
            if len(key.split()) < settings.min_words or key in seen or overlapping([[text]], suite_words):
                continue
            seen.add(key)
            found.append(text)
            if len(found) == count:
                return found
    return found


def suite_turns() -> list[str]:
    """Every turn of every suite specbench ships: none may be trained on."""
    return [turn for name in builtin_suite_names() for item in load_suite(name).items for turn in item.turns]


def build_corpus(target: Target, work: Path, settings: CorpusSettings, mark: str,
                 progress: Progress | None = None, shipped: Path | None = None) -> Corpus:
    """The corpus of `settings`, built chunk by chunk into work/corpus-NNNN.npz; chunks saved there or
    shipped in `shipped` (the same names) are read back."""
    size, chunks = settings.chunk, -(-settings.samples // settings.chunk)
    written_here = round(size * settings.written_share)
    written = [turns[0] for turns in chat_prompts(chunks * size, settings.seed)]
    suites = word_sequences(suite_turns())
    seen: set[str] = set()

    def instructions(index: int) -> list[str]:
        # a quarter of the chunk's own written forms, the rest a reserve for where the target writes fewer
        # instructions than asked (no chat template, a turn rarely closed); past the forms' last filling
        # the target writes them all
        forms = written[index * size:(index + 1) * size]
        made = synthesise(target, size - min(written_here, len(forms)), settings, settings.seed + index, seen, suites)
        return forms[:size - len(made)] + made

    # what a chunk's content depends on: everything but the total, so that a corpus grows by more chunks
    key = {**asdict(settings), "target": mark, "samples": None}
    return _chunks(target, work, settings.answer_tokens, settings.chunk, key, "corpus", chunks,
                   _single_turns(target, instructions), progress, shipped,
                   lambda meta: seen.update(_normal(text) for text in meta["instructions"]))


def build_passage_corpus(target: Target, work: Path, source: Corpus, count: int, settings: CorpusSettings,
                         mark: str, progress: Progress | None = None, shipped: Path | None = None) -> Corpus:
    """`count` tasks over passages the target wrote (its answers in `source`: summarise, translate, extract,
    rewrite ...), answered by it, built chunk by chunk into work/passages-NNNN.npz as `build_corpus` builds.

    Short instructions, written or synthesised, hardly ever make the target copy from its prompt, which
    summarising, extracting and translating a passage make it do all the time: a drafter trained without
    them drafts those answers worst (docs/smollm2.md). Chunks whose instructions would share a word
    sequence with a suite are made without those."""
    chunks = -(-min(count, len(source)) // settings.chunk)
    suites = word_sequences(suite_turns())
    tasks: list[str] = []  # made once, where a chunk is first made

    def instructions(index: int) -> list[str]:
        if not tasks:
            passages = [p for p in (passage(target.tokenizer.decode(a, skip_special_tokens=True))
                                    for a in source.answers) if p]
            tasks.extend(passage_prompts(passages, chunks * settings.chunk, settings.seed))
        chunk = tasks[index * settings.chunk:(index + 1) * settings.chunk]
        clashing = set(overlapping([[text] for text in chunk], suites))
        return [text for text in chunk if text not in clashing]

    key = {**asdict(settings), "target": mark, "samples": None, "passages_of": zlib.crc32(str(source.answers).encode())}
    return _chunks(target, work, settings.answer_tokens, settings.chunk, key, "passages", chunks,
                   _single_turns(target, instructions), progress, shipped)


@dataclass(frozen=True)
class ConversationSettings:
    """The corpus's share of what users ask: turns of real conversations (ShareGPT's layout), each with the
    conversation before it as context, answered by the target at the lengths users ask for."""

    samples: int = 0  # requests answered, in whole chunks (0: none)
    dataset: str = SHAREGPT  # the packaged ShareGPT, or a file in its layout
    answer_tokens: int = 256
    max_prompt_tokens: int = 1024  # earlier turns are left out of a longer context; a longer request is skipped
    min_words: int = 3
    chunk: int = 64
    window: int = 8  # chunks whose requests are sorted by length together: a batch pads to its longest prompt
    seed: int = 0


def conversation_requests(read: Read, tokenizer, settings: ConversationSettings, count: int,
                          suite_words: frozenset) -> tuple[list[tuple[str, list[int]]], Counter]:
    """The first `count` requests of `read`'s conversations in a seeded order, as (conversation id and turn,
    prompt ids), and the requests left out by reason. One user turn of each conversation, chosen by the same
    generator, with the turns and answers before it (the dataset's answers: only the last one is the
    target's to write); left out where its words are fewer than `min_words`, where it repeats an earlier
    request, where it shares a word sequence with a suite, or where it alone exceeds `max_prompt_tokens`."""
    rng = random.Random(settings.seed)
    order = list(read.conversations)
    rng.shuffle(order)
    chosen: list[tuple[str, list[int]]] = []
    left_out: Counter = Counter()
    seen: set[str] = set()
    for conversation in order:
        if len(chosen) == count:
            break
        requests = list(conversation.requests())
        turn = rng.randrange(len(requests))
        turns, answers = requests[turn]
        key = _normal(turns[-1])[:400]
        if len(key.split()) < settings.min_words:
            left_out["too short"] += 1
        elif key in seen:
            left_out["a repeated request"] += 1
        elif overlapping([list(turns)], suite_words):
            left_out["shares words with a suite"] += 1
        else:
            seen.add(key)
            first = 0
            ids = encode_turns(tokenizer, list(turns), list(answers))
            while len(ids) > settings.max_prompt_tokens and first < len(turns) - 1:
                first += 1
                ids = encode_turns(tokenizer, list(turns[first:]), list(answers[first:]))
            if len(ids) > settings.max_prompt_tokens:
                left_out["too long"] += 1
            else:
                chosen.append((f"{conversation.id}:{turn}", ids))
    return chosen, left_out


def build_conversation_corpus(target: Target, work: Path, settings: ConversationSettings, mark: str,
                              progress: Progress | None = None, shipped: Path | None = None) -> Corpus:
    """`settings.samples` requests of users' conversations answered by the target, built chunk by chunk into
    work/sharegpt-NNNN.npz as `build_corpus` builds. The requests of `window` chunks are sorted by prompt
    length together, so that a batch pads little; the order is fixed by the seed, so a corpus grown by more
    chunks keeps the ones it has."""
    size = settings.chunk
    chunks = -(-settings.samples // size)
    span = size * settings.window
    requests: list[tuple[str, list[int]]] = []  # made once, where a chunk is first made
    about: dict = {}

    def make(index: int) -> tuple[list[list[int]], dict]:
        if not requests:
            read = read_conversations(settings.dataset)
            wanted = -(-chunks * size // span) * span
            found, left_out = conversation_requests(read, target.tokenizer, settings, wanted,
                                                    word_sequences(suite_turns()))
            for at in range(0, len(found), span):
                requests.extend(sorted(found[at:at + span], key=lambda request: len(request[1])))
            about.update(read=read.summary(), left_out=dict(left_out))
        chunk = requests[index * size:(index + 1) * size]
        return [ids for _, ids in chunk], {"requests": [name for name, _ in chunk], **about}

    key = {**asdict(settings), "target": mark, "samples": None, "dataset": _dataset_mark(settings.dataset)}
    return _chunks(target, work, settings.answer_tokens, size, key, "sharegpt", chunks, make, progress, shipped)


def _dataset_mark(dataset: str) -> str:
    """What names a dataset's content in a chunk's key: the packaged ShareGPT by name, a file by its size and name."""
    if dataset == SHAREGPT:
        return SHAREGPT  # shipped chunks are read back where the package is not installed
    path = dataset_path(dataset)
    return f"{path.name}:{path.stat().st_size}"


def _single_turns(target: Target, instructions: Callable[[int], list[str]]) -> Callable[[int], tuple[list, dict]]:
    """A chunk's prompts made of one user turn each, with the turns kept in its metadata."""
    def make(index: int) -> tuple[list[list[int]], dict]:
        texts = instructions(index)
        return [encode_turns(target.tokenizer, [text], []) for text in texts], {"instructions": texts}
    return make


def _chunks(target: Target, work: Path, answer_tokens: int, size: int, key: dict, prefix: str, chunks: int,
            make: Callable[[int], tuple[list[list[int]], dict]], progress: Progress | None, shipped: Path | None,
            on_saved: Callable[[dict], None] = lambda meta: None) -> Corpus:
    """The chunks work/<prefix>-NNNN.npz made with `key`: each read back where it is saved there or shipped
    (`on_saved` hears its metadata), else the prompts of `make(index)` answered greedily by the target, up to
    `answer_tokens` each, and saved with make's metadata."""
    corpus = Corpus([], [])
    for index in range(chunks):
        name = f"{prefix}-{index:04d}.npz"
        chunk, meta = _saved_chunk([d / name for d in (shipped, work) if d is not None], key)
        if chunk is None:
            prompts, about = make(index)
            answers = generate_batch(target.model, prompts, answer_tokens,
                                     eos_ids=target.eos_ids).sequences if prompts else []
            chunk = Corpus(prompts, [g.tokens for g in answers])
            work.mkdir(parents=True, exist_ok=True)
            save_corpus(work / name, chunk, {"key": key, **about})
        else:
            on_saved(meta)
        corpus.extend(chunk)
        if progress:
            progress(len(corpus), chunks * size)
    return corpus


def _saved_chunk(paths: list[Path], key: dict) -> tuple[Corpus | None, dict]:
    """The first of `paths` that holds a chunk made with `key`."""
    for path in paths:
        if path.is_file():
            chunk, meta = load_corpus(path)
            if meta.get("key") == key:
                return chunk, meta
    return None, {}
