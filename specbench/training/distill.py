"""Self-distillation data: the target's own answers to training prompts and its hidden states.

For every prompt the target regenerates its answer (greedy, the same decode loop the benchmark
uses), then one forward over prompt + answer keeps the hidden states of the layers the drafter
reads plus the final normed state, from which the target's logits are recomputed on the fly
through its frozen LM head (so no vocabulary-sized tensor is stored).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from specbench.core.files import atomic_path
from specbench.decoding.batch import generate_batch
from specbench.decoding.target import Target, encode_turns
from specbench.methods.trainable import DistillBatch
from specbench.training.corpus import Corpus

HELD_OUT_EVERY = 64  # one corpus prompt in this many is kept out of training (chosen by a hash of its ids)


@dataclass
class DistillSequence:
    input_ids: torch.Tensor  # (T,) prompt then the target's answer
    answer_start: int  # first answer position
    hidden: torch.Tensor  # (len(layers) + 1, T, H) bfloat16: requested layers, then the final normed state


@torch.inference_mode()
def collect(target: Target, prompts: list[list[str]], layers: tuple[int, ...], max_new_tokens: int,
            on_prompt: Callable[[], None] | None = None, batch_size: int = 1) -> list[DistillSequence]:
    """Regenerate the target's answers to `prompts` (each a list of turns; the first is used), decoding
    `batch_size` of them at a time (greedy, each the answer it would get alone: decoding/batch.py)."""
    sequences = []
    encoded = [encode_turns(target.tokenizer, turns[:1], []) for turns in prompts]
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start:start + batch_size]
        answers = generate_batch(target.model, chunk, max_new_tokens, eos_ids=target.eos_ids).sequences
        sequences += hidden_states(target, [p + a.tokens for p, a in zip(chunk, answers)], [len(p) for p in chunk],
                                   layers)
        for _ in chunk:
            if on_prompt:
                on_prompt()
    return sequences


@torch.inference_mode()
def hidden_states(target: Target, ids: list[list[int]], answer_starts: list[int], layers: tuple[int, ...],
                  window: int | None = None) -> list[DistillSequence]:
    """Sequences (prompt then answer) with the target's hidden states of `layers` and its final normed
    state, from one forward over all of them (padded on the right: a causal model's states of the real
    positions are those of each sequence alone). With `window`, each keeps only the positions a training
    batch of that length takes (`make_batch`): a long conversation's context is read, not stored."""
    length = max(len(i) for i in ids)
    padded = torch.zeros(len(ids), length, dtype=torch.long, device=target.device)
    mask = torch.zeros(len(ids), length, dtype=torch.long, device=target.device)
    for row, seq in enumerate(ids):
        padded[row, :len(seq)] = torch.tensor(seq, device=target.device)
        mask[row, :len(seq)] = 1
    states = target.model(input_ids=padded, attention_mask=mask, output_hidden_states=True).hidden_states
    picked = torch.stack([states[i] for i in layers] + [states[-1]], 1).to(torch.bfloat16).cpu()
    kept = []
    for row, (seq, start) in enumerate(zip(ids, answer_starts)):
        begin, end = batch_window(start, len(seq), window) if window else (0, len(seq))
        kept.append(DistillSequence(padded[row, begin:end].cpu(), start - begin, picked[row, :, begin:end].clone()))
    return kept


def batch_window(answer_start: int, length: int, max_len: int) -> tuple[int, int]:
    """The positions [begin, end) of a sequence that a training batch of `max_len` positions takes: from a
    few positions before its answer, or its last `max_len` where the answer is shorter than that."""
    begin = max(0, min(answer_start - 8, length - max_len))
    return begin, min(length, begin + max_len)


def pick_layers(sequences: list[DistillSequence], collected: tuple[int, ...],
                wanted: tuple[int, ...]) -> list[DistillSequence]:
    """Sequences collected for `collected` layers, narrowed to the `wanted` ones (final state kept)."""
    rows = [collected.index(layer) for layer in wanted] + [len(collected)]
    return [DistillSequence(s.input_ids, s.answer_start, s.hidden[rows]) for s in sequences]


def make_batch(sequences: list[DistillSequence], max_len: int, device: torch.device) -> DistillBatch:
    """Pad (and cut to `max_len` positions, keeping the start of each answer) into one batch."""
    cuts = [batch_window(s.answer_start, len(s.input_ids), max_len) for s in sequences]
    length = max(end - begin for begin, end in cuts)
    layers, _, hidden_size = sequences[0].hidden.shape
    ids = torch.zeros(len(sequences), length, dtype=torch.long)
    hidden = torch.zeros(len(sequences), layers, length, hidden_size)
    mask = torch.zeros(len(sequences), length, dtype=torch.bool)
    attention = torch.zeros(len(sequences), length, dtype=torch.bool)
    for row, (s, (begin, end)) in enumerate(zip(sequences, cuts)):
        n = end - begin
        ids[row, :n] = s.input_ids[begin:end]
        hidden[row, :, :n] = s.hidden[:, begin:end].float()
        mask[row, max(0, s.answer_start - begin):n] = True
        attention[row, :n] = True
    return DistillBatch(ids.to(device), hidden.to(device), mask.to(device), attention.to(device))


def split(corpus: Corpus) -> tuple[Corpus, list[list[int]]]:
    """The training part of `corpus` and the held-out prompts: one in HELD_OUT_EVERY, by a hash of its ids,
    so that a corpus grown by more chunks keeps the same prompts out."""
    training, held = Corpus([], []), []
    for prompt, answer in zip(corpus.prompts, corpus.answers):
        if zlib.crc32(str(prompt).encode()) % HELD_OUT_EVERY == 0:
            held.append(prompt)
        else:
            training.prompts.append(prompt)
            training.answers.append(answer)
    return training, held


def features(target, corpus: Corpus, layers: tuple[int, ...], work: Path, batch: int, mark: str,
             progress: Callable[[int, int], None], window: int | None = None) -> list[DistillSequence]:
    """Each prompt and answer with the target's hidden states of `layers` (only the positions a training
    batch of `window` takes, where given), computed `batch` sequences at a time into work/features-NNNN.pt;
    saved chunks made from the same ids are read back, narrowed to `layers` where they hold more (a build of
    every drafter serves a later one of some)."""
    work.mkdir(parents=True, exist_ok=True)
    sequences: list[DistillSequence] = []
    for index, start in enumerate(range(0, len(corpus), batch)):
        ids = [p + a for p, a in zip(corpus.prompts[start:start + batch], corpus.answers[start:start + batch])]
        starts = [len(p) for p in corpus.prompts[start:start + batch]]
        key = {"target": mark, "layers": list(layers), "ids": zlib.crc32(str(ids).encode()), "window": window}
        path = work / f"features-{index:04d}.pt"
        saved = torch.load(path, weights_only=False) if path.is_file() else None
        if saved is not None and _serves(saved["key"], key):
            sequences += pick_layers(saved["sequences"], tuple(saved["key"]["layers"]), layers)
        else:
            saved = {"key": key, "sequences": hidden_states(target, ids, starts, layers, window)}
            with atomic_path(path) as tmp:
                torch.save(saved, tmp)
            sequences += saved["sequences"]
        progress(len(sequences), len(corpus))
    return sequences


def _serves(saved: dict, wanted: dict) -> bool:
    """A chunk saved under key `saved` holds what `wanted` asks for: the same target and ids, every layer."""
    return ({k: v for k, v in saved.items() if k != "layers"} == {k: v for k, v in wanted.items() if k != "layers"}
            and set(wanted["layers"]) <= set(saved["layers"]))
