"""The prompts a serve run sends: the suite's first turns, ShareGPT's conversations, or synthetic prompts of
a fixed input length.

Suite and ShareGPT prompts are encoded under the tokenizer's chat template, as specbench's own engine
decodes them. ShareGPT's are what `vllm bench serve --dataset-name sharegpt` sends, from the same file:
each conversation's first user turn, or with `multi_turn` every user turn with the conversation before it
(the answers ShareGPT recorded, replayed as the context); conversations in the file's order, a prompt of
fewer than MIN_TOKENS or more than MAX_TOKENS tokens left out, as vLLM's benchmark leaves them out.
Synthetic prompts are token ids drawn uniformly from the vocabulary without its special tokens, seeded,
sent as they are (no chat template), as `vllm bench serve --dataset-name random` draws them; a chat
endpoint gets their decoded text.
"""

from __future__ import annotations

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


def synthetic_prompts(tokenizer, count: int, length: int, seed: int) -> list[Prompt]:
    """`count` prompts of `length` random token ids each."""
    special = set(tokenizer.all_special_ids)
    vocabulary = np.array([i for i in range(len(tokenizer)) if i not in special])
    rng = np.random.default_rng(seed)
    prompts = []
    for i in range(count):
        ids = [int(t) for t in rng.choice(vocabulary, size=length)]
        prompts.append(Prompt(f"synthetic-{i}", ids, user(tokenizer.decode(ids))))
    return prompts
