"""The prompts a serve run sends: the suite's first turns, or synthetic prompts of a fixed input length.

Suite prompts are encoded under the tokenizer's chat template, as specbench's own engine decodes them.
Synthetic prompts are token ids drawn uniformly from the vocabulary without its special tokens, seeded,
sent as they are (no chat template), as `vllm bench serve --dataset-name random` draws them; a chat
endpoint gets their decoded text.
"""

from __future__ import annotations

import numpy as np

from specbench.serving.client import Prompt


def suite_prompts(tokenizer, items) -> list[Prompt]:
    from specbench.decoding.target import encode_turn

    return [Prompt(item.id, encode_turn(tokenizer, item), item.turns[0]) for item in items]


def synthetic_prompts(tokenizer, count: int, length: int, seed: int) -> list[Prompt]:
    """`count` prompts of `length` random token ids each."""
    special = set(tokenizer.all_special_ids)
    vocabulary = np.array([i for i in range(len(tokenizer)) if i not in special])
    rng = np.random.default_rng(seed)
    prompts = []
    for i in range(count):
        ids = [int(t) for t in rng.choice(vocabulary, size=length)]
        prompts.append(Prompt(f"synthetic-{i}", ids, tokenizer.decode(ids)))
    return prompts
