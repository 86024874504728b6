"""The hidden-state chunks a build saves: read back when they were made from the same ids and hold every
layer asked for (a build of every drafter serves a later build of one), made again otherwise."""

from __future__ import annotations

import torch

from specbench.training.corpus import Corpus
from specbench.training.distill import features
from tests.helpers import tiny_target


def test_saved_features_serve_a_build_of_fewer_layers_and_not_other_ids(tmp_path):
    target = tiny_target("qwen3-gqa", seed=1)
    corpus = Corpus([[1, 2, 3], [4, 5]], [[6, 7], [8, 9, 10]])
    every = features(target, corpus, (1, 2), tmp_path, 2, "mark", lambda done, total: None)
    saved = (tmp_path / "features-0000.pt").stat().st_mtime_ns
    some = features(target, corpus, (2,), tmp_path, 2, "mark", lambda done, total: None)
    assert (tmp_path / "features-0000.pt").stat().st_mtime_ns == saved  # read back, not made again
    for whole, narrow in zip(every, some):
        assert torch.equal(narrow.hidden, whole.hidden[1:]) and torch.equal(narrow.input_ids, whole.input_ids)
    other = features(target, Corpus([[1, 2, 3], [4, 5]], [[6, 7], [8, 9]]), (2,), tmp_path, 2, "mark",
                     lambda done, total: None)
    assert [len(s.input_ids) for s in other] == [5, 4]  # other ids: made again, for these ids
