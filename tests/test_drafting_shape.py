"""A drafter's recorded drafting shape (`drafting` in its config.json, chosen by `specbench tune` on its
model) is what every engine drafts with when a run sets no knobs: specbench's engine, vLLM's translation
in process and behind a server; the user's knobs go over it."""

from __future__ import annotations

import json
import shutil

import pytest

from specbench.decoding.model_source import KNOWN_MODELS
from specbench.engines.vllm import translate
from specbench.methods.build import build_strategy
from specbench.methods.names import parse_strategy
from specbench.methods.published.formats import drafter_dirs_by_strategy
from specbench.methods.registry import definition
from specbench.plan.run_config import RunConfig

SHAPE = {"depth": 3, "top_k": 1, "total_tokens": 3}


@pytest.fixture
def shaped_eagle(tmp_path):
    """The embedded EAGLE drafter with a recorded shape other than the method's defaults."""
    drafter = tmp_path / "eagle"
    shutil.copytree(KNOWN_MODELS["default"].drafter_dir("eagle"), drafter)
    config = json.loads((drafter / "config.json").read_text())
    config["drafting"] = SHAPE
    (drafter / "config.json").write_text(json.dumps(config))
    assert definition("eagle").options().depth != SHAPE["depth"]
    return drafter


def drafts(translated) -> int:
    return translated.speculative_config["num_speculative_tokens"]


def test_specbench_and_vllm_draft_with_the_recorded_shape_under_the_users_knobs(default_target, shaped_eagle):
    spec = parse_strategy("eagle")
    sources = drafter_dirs_by_strategy([shaped_eagle], [spec])
    built = build_strategy(spec, default_target, {}, sources)
    assert {k: built.drafter_sources["eagle"]["knobs"][k] for k in SHAPE} == SHAPE
    translated = translate(spec, {}, None, sources, default_target)
    assert drafts(translated) == SHAPE["depth"] and translated.knobs["depth"] == SHAPE["depth"]
    assert drafts(translate(spec, {"eagle": {"depth": 5}}, None, sources, default_target)) == 5
    # before the target loads, only what the user set is checked (and refused where vLLM lacks it)
    assert drafts(translate(spec, {}, None, sources)) == definition("eagle").options().depth


@pytest.mark.vllm
@pytest.mark.usefixtures("vllm_installed")
def test_a_server_drafts_with_the_recorded_shape(default_target, shaped_eagle, tmp_path, monkeypatch):
    from specbench.serving.vllm_args import server_arguments

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the converted drafter: not the user's cache
    plan = RunConfig(strategies=["eagle"], drafters=[str(shaped_eagle)], engine="vllm").plan()
    assert server_arguments(plan, lambda: default_target)["eagle"]["speculative_config"]["num_speculative_tokens"] \
        == SHAPE["depth"]
    given = RunConfig(strategies=["eagle"], drafters=[str(shaped_eagle)], engine="vllm",
                      knobs={"eagle": {"depth": 2}}).plan()
    assert server_arguments(given, lambda: default_target)["eagle"]["speculative_config"]["num_speculative_tokens"] == 2


@pytest.mark.vllm
@pytest.mark.usefixtures("vllm_installed")
def test_a_study_on_servers_starts_from_the_recorded_shape(shaped_eagle, tmp_path, monkeypatch):
    from specbench.plan.run_config import layered
    from specbench.tuning.serve_study import plan_served
    from specbench.tuning.study_config import TuneConfig

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = TuneConfig(layered({}, {"drafters": [str(shaped_eagle)]}), ("eagle",), concurrency=2).validate()
    defaults = plan_served(config, parse_strategy("eagle")).space.defaults()
    assert defaults["depth"] == SHAPE["depth"]  # top_k and total_tokens: vLLM has none, held at the method's
