"""Every learned method drafts in the dtype `drafting_dtype` picks (bfloat16 beside a float32 target on a CPU
that multiplies it natively): loaded so from its directory, and still reproducing greedy decoding exactly.
The sampling side is proved by enumeration in test_exact_sampling.py."""

from __future__ import annotations

import random

import pytest
import torch

import specbench.methods.base as base
from specbench.decoding.decode import generate
from specbench.methods.controllers import FixedController
from specbench.methods.knobs import make_options
from specbench.methods.registry import definition
from tests.helpers import random_prompt, train_tiny

LEARNED = ["eagle", "mtp", "dflash", "dspark"]


@pytest.fixture(scope="module", params=LEARNED)
def trained(request, tmp_path_factory):
    method = definition(request.param)
    return method, train_tiny(method, make_options(method.name, {"draft_vocab": 60}), tmp_path_factory)


@pytest.mark.parametrize("native", [True, False])
def test_a_learned_drafter_loads_in_the_drafting_dtype_and_stays_exact(trained, native, monkeypatch):
    method, tiny = trained
    monkeypatch.setattr(base, "bf16_native", lambda device: native)  # False: an AVX2-only CPU
    monkeypatch.setattr(base, "onednn", lambda dtype: native)
    drafter = method.build(tiny.target, tiny.options, tiny.directory)
    expected = torch.bfloat16 if native else torch.float32
    assert {p.dtype for p in drafter.model.parameters()} == {expected}
    rng, accepted = random.Random(7), 0
    for _ in range(3):
        prompt = random_prompt(rng, 97, length=rng.randint(2, 20))
        plain = generate(tiny.target.model, prompt, 12)
        drafted = generate(tiny.target.model, prompt, 12, drafter=drafter, controller=FixedController(3))
        assert drafted.tokens == plain.tokens
        accepted += drafted.accepted
    assert accepted > 0  # drafts were verified and kept, not only rejected
