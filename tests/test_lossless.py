"""The lossless check's report: where a greedy output first differs from `ar`, and the logit margin there."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import specbench.engines.specbench
from specbench.analysis.lossless import divergence_margin, first_divergence, mismatch_detail
from specbench.cli import app


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 4, 5], [1, 2, 3, 5]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # one output ended early (an EOS the other did not take)


def test_divergence_margin_is_the_logit_gap_after_ars_prefix(target):
    prompt, reference = [3, 1, 4, 1, 5], [9, 2, 6, 5]
    with torch.inference_mode():
        logits = target.model(input_ids=torch.tensor([prompt + reference[:2]])).logits[0, -1]
    other = int(logits.argsort()[0])  # the least likely token: a large margin
    margin = divergence_margin(target.model, prompt, reference[:2] + [other], reference, 2)
    assert abs(margin - float(logits[reference[2]] - logits[other])) < 1e-5
    assert divergence_margin(target.model, prompt, reference + [other], reference, 4) is None  # ar's ended there


def test_mismatch_detail_names_position_and_margins():
    assert mismatch_detail([], []) == ""
    text = mismatch_detail([7, 3], [0.01, 2.5])
    assert "earliest divergence at token 3" in text and "0.01 to 2.5" in text
    assert "logit margin there 0 (" in mismatch_detail([37], [0.0])  # one bf16 tie, as measured on the default


def test_a_broken_strategy_is_reported_with_its_margin(tiny_model_dir, tmp_path, monkeypatch):
    """A run whose `ngram` outputs are corrupted at token 3 must say so, with the target's margin there."""
    real_generate = specbench.engines.specbench.generate
    corrupted = []  # (model, prompt, the corrupted tokens, ar's tokens)

    def corrupting_generate(model, prompt, *args, **kwargs):
        gen = real_generate(model, prompt, *args, **kwargs)
        if args[3] is not None:  # generate(model, prompt, max_new_tokens, sampling, eos_ids, drafter, ...): not ar
            original = list(gen.tokens)
            gen.tokens[3] = (gen.tokens[3] + 1) % model.config.vocab_size
            corrupted.append((model, prompt, gen.tokens, original))
        return gen

    monkeypatch.setattr(specbench.engines.specbench, "generate", corrupting_generate)
    result = CliRunner().invoke(app, ["run", "--model", str(tiny_model_dir), "--strategy", "ngram", "--limit", "2",
                                      "--max-new-tokens", "8", "--warmup", "0", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    ngram = next(r for r in json.loads(result.stdout)["results"] if r["strategy"] == "ngram")
    assert ngram["mismatches"] == 2 and ngram["first_divergence"] == [3, 3]
    expected = sorted(divergence_margin(*c, 3) for c in corrupted)
    assert all(m > 0 for m in expected)  # ar took the argmax, so its token leads
    assert sorted(ngram["divergence_margin"]) == pytest.approx(expected, abs=1e-4)

    table = CliRunner().invoke(app, ["run", "--model", str(tiny_model_dir), "--strategy", "ngram", "--limit", "1",
                                     "--max-new-tokens", "8", "--warmup", "0", "--out", str(tmp_path)])
    assert table.exit_code == 0
    assert "LOSSLESS CHECK FAILED: ngram: 1 of 1" in table.output and "logit margin there" in table.output
