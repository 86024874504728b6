"""A reduced draft vocabulary: which tokens it holds, how its logits map back to the target's, and the maps
refused when loading a drafter (two draft ids on one target id, ids a tokenizer of another size names)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from specbench.core.errors import SpecbenchError
from specbench.decoding.target import fingerprint
from specbench.methods.draft_vocab import DraftVocab, frequent_tokens
from specbench.methods.drafter_dir import WEIGHTS, save_drafter
from specbench.methods.eagle import EagleModel, EagleOptions
from specbench.methods.registry import definition
from tests.helpers import tiny_target


def test_the_most_frequent_answer_tokens_come_first_and_unseen_ids_fill_up():
    assert frequent_tokens([[5, 3, 5], [3, 5, 9]], 3, 12).tolist() == [5, 3, 9]
    assert frequent_tokens([[7, 7, 2]], 4, 12).tolist() == [7, 2, 0, 1]
    for size in (0, 13):
        with pytest.raises(SpecbenchError, match="draft vocabulary of"):
            frequent_tokens([[1]], size, 12)


def test_draft_logits_map_back_to_the_target_ids():
    target = tiny_target()
    vocab = DraftVocab(target.model, 3).set_ids(torch.tensor([7, 2, 40]))
    hidden = torch.randn(2, target.model.config.hidden_size)
    full = target.model.lm_head(hidden)
    expanded = vocab.logits(hidden)
    assert torch.allclose(expanded[:, [7, 2, 40]], full[:, [7, 2, 40]], atol=1e-5)
    assert torch.isinf(expanded).sum() == 2 * (target.model.config.vocab_size - 3)
    labels, known = vocab.labels(torch.tensor([40, 3, 7]))
    assert labels.tolist() == [2, 0, 0] and known.tolist() == [True, False, True]
    assert torch.allclose(vocab.target_probs(hidden), full[:, [7, 2, 40]].softmax(-1), atol=1e-5)


@pytest.mark.parametrize("ids, why", [([3, 3, 5], "two draft ids to one target id"),
                                      ([3, 4, 9999], "outside the target's")])
def test_a_bad_map_in_a_drafter_is_refused_in_one_line(tmp_path, ids, why):
    target = tiny_target()
    model = EagleModel.for_target(target, EagleOptions(draft_vocab=3))
    save_drafter(tmp_path, "eagle", model.drafter_config(), model.state_dict(), fingerprint(target.model))
    state = load_file(tmp_path / WEIGHTS)
    state["vocab.ids"] = torch.tensor(ids)
    save_file(state, tmp_path / WEIGHTS)
    with pytest.raises(SpecbenchError, match=why) as error:
        definition("eagle").build(target, EagleOptions(), tmp_path)
    assert "\n" not in str(error.value)


def test_the_map_is_saved_as_ids_and_the_rows_rebuilt_from_the_target(tmp_path):
    target = tiny_target()
    model = EagleModel.for_target(target, EagleOptions(draft_vocab=5))
    model.vocab.set_ids(torch.tensor([9, 1, 4, 0, 30]))
    save_drafter(tmp_path, "eagle", model.drafter_config(), model.state_dict(), fingerprint(target.model))
    state = load_file(tmp_path / WEIGHTS)
    assert state["vocab.ids"].dtype == torch.int64 and not any("lm_head" in k for k in state)
    loaded = definition("eagle").build(target, EagleOptions(), tmp_path)
    assert loaded.model.vocab.ids.tolist() == [9, 1, 4, 0, 30]
    hidden = torch.randn(1, target.model.config.hidden_size)
    with torch.inference_mode():
        assert torch.allclose(loaded.model.vocab.compact(hidden), model.vocab.compact(hidden), atol=1e-5)
