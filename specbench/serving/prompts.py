"""The prompts a serve run sends: the suite's first turns, ShareGPT's conversations, or synthetic prompts of
a fixed input length.

Suite and ShareGPT prompts are encoded under the tokenizer's chat template, as specbench's own engine
decodes them. ShareGPT's are what `vllm bench serve --dataset-name sharegpt` sends, from the same file:
each conversation's first user turn, or with `multi_turn` every user turn with the conversation before it
(the answers ShareGPT recorded, replayed as the context); conversations in the file's order, a prompt of
fewer than MIN_TOKENS or more than MAX_TOKENS tokens left out, as vLLM's benchmark leaves them out.
Synthetic prompts are token ids drawn uniformly from the vocabulary without its special tokens, seeded,
sent as they are (no chat template), as `vllm bench serve --dataset-name random` draws them, with its
range ratio (lengths spread uniformly around the one asked) and shared prefix; a chat endpoint gets their
decoded text.
"""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import islice

import numpy as np

from specbench.core.errors import SpecbenchError
from specbench.plan.sharegpt import read_conversations
from specbench.serving.client import Prompt

MIN_TOKENS, MAX_TOKENS = 4, 1024  # vllm bench serve's bounds on a ShareGPT prompt


def user(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


def suite_prompts(tokenizer, items) -> list[Prompt]:
    from specbench.decoding.target import encode_turn

    return [Prompt(item.id, encode_turn(tokenizer, item), user(item.turns[0])) for item in items]


def dataset_prompts(tokenizer, dataset: str, count: int, multi_turn: bool) -> list[Prompt]:
    """The first `count` prompts of a ShareGPT file (`sharegpt`: the packaged one), within the token bounds."""
    from specbench.decoding.target import chat_messages, encode_turns

    prompts: list[Prompt] = []
    for conversation in read_conversations(dataset).conversations:
        requests = conversation.requests() if multi_turn else islice(conversation.requests(), 1)
        for users, answers in requests:
            ids = encode_turns(tokenizer, list(users), list(answers))
            if not MIN_TOKENS <= len(ids) <= MAX_TOKENS:
                continue
            prompts.append(Prompt(f"{conversation.id}/{len(users)}", ids, tuple(chat_messages(users, answers))))
            if len(prompts) == count:
                return prompts
    if not prompts:
        raise SpecbenchError(f"--dataset {dataset}: no prompt of {MIN_TOKENS} to {MAX_TOKENS} tokens in it")
    return prompts


def spread(length: int, ratio: float, count: int, rng: np.random.Generator) -> list[int]:
    """`count` lengths drawn uniformly from [length x (1 - ratio), length x (1 + ratio)], at least 1, as
    `vllm bench serve --random-range-ratio` draws them."""
    low, high = max(1, math.floor(length * (1 - ratio))), max(1, math.ceil(length * (1 + ratio)))
    return [int(n) for n in rng.integers(low, high + 1, size=count)]


def synthetic_prompts(tokenizer, count: int, length: int, seed: int, ratio: float = 0.0,
                      prefix_len: int | None = None) -> list[Prompt]:
    """`count` prompts of random token ids, `length` each or spread by `ratio`, after a random prefix of
    `prefix_len` tokens that they all share (`vllm bench serve --random-prefix-len`), which a server's prefix
    cache holds once."""
    special = set(tokenizer.all_special_ids)
    vocabulary = np.array([i for i in range(len(tokenizer)) if i not in special])
    rng = np.random.default_rng(seed)
    prefix = [int(t) for t in rng.choice(vocabulary, size=prefix_len or 0)]
    prompts = []
    for i, size in enumerate(spread(length, ratio, count, rng)):
        ids = prefix + [int(t) for t in rng.choice(vocabulary, size=size)]
        prompts.append(Prompt(f"synthetic-{i}", ids, user(tokenizer.decode(ids))))
    return prompts


def with_answer_lengths(prompts: list[Prompt], length: int, ratio: float, seed: int) -> list[Prompt]:
    """Each prompt with an answer length of its own, spread by `ratio` around `length`."""
    lengths = spread(length, ratio, len(prompts), np.random.default_rng(seed + 1))
    return [replace(prompt, max_tokens=n) for prompt, n in zip(prompts, lengths)]
