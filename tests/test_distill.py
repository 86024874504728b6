"""The hidden-state chunks a build saves: read back when they were made from the same ids and hold every
layer asked for (a build of every drafter serves a later build of one), made again otherwise."""

from __future__ import annotations

import torch

from specbench.training.corpus import Corpus
from specbench.training.distill import features, make_batch
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


def test_a_window_keeps_what_a_training_batch_takes_and_nothing_before(tmp_path):
    """A long context is read by the forward but not stored: the batch made from the kept positions is the
    batch made from the whole sequence."""
    target = tiny_target("qwen3-gqa", seed=1)
    corpus = Corpus([list(range(1, 40)), [4, 5]], [[6, 7, 8, 9, 10, 11], [8, 9, 10]])
    whole = features(target, corpus, (1,), tmp_path / "whole", 2, "mark", lambda done, total: None)
    kept = features(target, corpus, (1,), tmp_path / "kept", 2, "mark", lambda done, total: None, window=12)
    assert [len(s.input_ids) for s in kept] == [12, 5] and kept[0].answer_start == 8
    a, b = make_batch(whole, 12, torch.device("cpu")), make_batch(kept, 12, torch.device("cpu"))
    assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("input_ids", "hidden", "mask", "attention"))
