"""`--strategy mtp` on a target that ships its own MTP modules (DeepSeek-V3, Qwen3-Next and MiMo
layouts, transformers' classes): no --drafter, the module's proposals equal a direct evaluation,
greedy output identical to ar, and one-line refusals."""

from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from specbench.core.errors import SpecbenchError
from specbench.decoding.decode import generate
from specbench.decoding.target import Target, load_lm
from specbench.methods.build import build_strategy
from specbench.methods.names import parse_strategy
from tests.published_layouts import mtp_target, propose

FAMILIES = {"deepseek-v3": "mtp-deepseek-v3", "qwen3-next": "mtp-qwen3-next", "mimo": "mtp-mimo"}


def load(path) -> Target:
    return Target(load_lm(str(path), torch.device("cpu"), torch.float32), None, str(path), frozenset())


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_target(request, tmp_path_factory):
    """(family, the module's direct evaluation, the target as specbench loads it)."""
    path = tmp_path_factory.mktemp("mtp") / request.param
    reference = mtp_target(path, request.param)
    return request.param, reference, load(path)


def mtp(target, **knobs):
    return build_strategy(parse_strategy("mtp"), target, {"mtp": knobs}, {})


def test_the_targets_own_modules_are_used(family_target):
    family, _, target = family_target
    strategy = mtp(target)
    described = strategy.drafter_sources["mtp"]
    assert described["format"] == FAMILIES[family]
    assert described["knobs"]["n_modules"] == 1  # what the checkpoint has, not the default 3
    assert strategy.drafter.hidden_layers == (target.model.config.num_hidden_layers,)


def test_proposals_equal_a_direct_evaluation(family_target):
    _, reference, target = family_target
    drafter = mtp(target).drafter
    rng = random.Random(0)
    for _ in range(3):
        prompt = [rng.randrange(97) for _ in range(rng.randint(2, 12))]
        tree = propose(drafter, target.model, prompt, 1)
        assert tree.tokens == reference.first_level(target.model, prompt, 3)


def test_greedy_output_identical_to_ar(family_target):
    _, _, target = family_target
    strategy = mtp(target, entropy_threshold=10.0)
    rng = random.Random(1)
    for _ in range(5):
        prompt = [rng.randrange(97) for _ in range(rng.randint(1, 14))]
        n, eos = rng.randint(1, 20), frozenset({rng.randrange(97)})
        expected = generate(target.model, prompt, n, eos_ids=eos)
        got = generate(target.model, prompt, n, eos_ids=eos, drafter=strategy.drafter,
                       controller=strategy.new_controller())
        assert (got.tokens, got.stop_reason) == (expected.tokens, expected.stop_reason)
        assert got.drafted > 0


def test_more_modules_than_shipped_is_refused(family_target):
    with pytest.raises(SpecbenchError, match="n_modules=2, but the drafter has 1"):
        mtp(family_target[2], n_modules=2)


@pytest.mark.parametrize("family,key,expected", [
    ("deepseek-v3", "model.layers.2.eh_proj.weight", "layers.0.eh_proj.weight is missing"),
    ("qwen3-next", "mtp.pre_fc_norm_hidden.weight", "layers.0.hnorm.weight is missing"),
])
def test_a_missing_or_misshapen_weight_is_one_line(tmp_path, family, key, expected):
    for change, message in ((lambda s: s.pop(key), expected),
                            (lambda s: s.update({key: torch.zeros(*[d + 1 for d in s[key].shape])}), "wrong shape")):
        path = tmp_path / f"{family}-{message[:5]}"
        mtp_target(path, family)
        state = load_file(str(path / "model.safetensors"))
        change(state)
        save_file(state, str(path / "model.safetensors"))
        with pytest.raises(SpecbenchError, match=message):
            mtp(load(path))


def test_declared_modules_without_weights_are_refused(tmp_path):
    path = tmp_path / "stripped"
    mtp_target(path, "deepseek-v3")
    state = load_file(str(path / "model.safetensors"))
    save_file({k: v for k, v in state.items() if not k.startswith("model.layers.2.")}, str(path / "model.safetensors"))
    with pytest.raises(SpecbenchError, match="declares 1 MTP modules, but no MTP weights"):
        mtp(load(path))
