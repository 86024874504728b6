"""Knob metadata and the search spaces the method modules declare: sampling, conditions, bounds, listing."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import optuna
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.errors import SpecbenchError
from specbench.methods.combine_options import MODES, ROUTERS, CombineOptions
from specbench.methods.combine_options import SPACE as COMBINE_SPACE
from specbench.methods.controllers import CONTROLLERS
from specbench.methods.dspark import DSparkOptions
from specbench.methods.names import parse_strategy
from specbench.methods.registry import DRAFTER_NAMES, definition, definitions
from specbench.methods.search_space import Choice, FloatRange, IntRange, Param, Ref, SearchSpace, When, knob_infos
from specbench.tuning.study_space import StudySpace, study_space

optuna.logging.set_verbosity(optuna.logging.WARNING)
SCHEDULER = {"window_size", "adjust_interval", "k_min", "k_max", "hysteresis", "grow_above", "shrink_below"}


def sample(space: SearchSpace, n: int, seed: int = 0) -> list[dict]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    points = []

    def objective(trial):
        points.append(space.suggest(trial))
        return 0.0

    study.optimize(objective, n_trials=n)
    return points


def test_every_knob_is_described_and_architecture_knobs_are_not_searched():
    for name, method in definitions().items():
        infos = knob_infos(method.options)
        assert set(infos) == {f.name for f in dataclasses.fields(method.options)}, name
        for knob, info in infos.items():
            assert info.description, f"{name}.{knob}"
            if info.architecture:
                assert knob not in method.space.names, f"{name}.{knob} is fixed by training"
        assert {"layers", "markov_rank", "gamma"} & set(method.space.names) == set()
        # every searched name is a knob of the method, or its controller choice
        assert set(method.space.names) <= set(infos) | {"controller"}, name


@pytest.mark.parametrize("name", list(definitions()))
def test_the_defaults_lie_in_the_search_space(name):
    method = definition(name)
    space = method.space.fix("trained_modules", 3)  # the embedded MTP drafter's modules; no-op elsewhere
    point = StudySpace(parse_strategy(name), space, {}, None).defaults()
    defaults = method.options()
    for key, value in point.items():
        assert value == (method.default_controller if key == "controller" else getattr(defaults, key)), key


def test_dspark_scheduler_knobs_only_with_its_controller_and_every_point_is_valid():
    points = sample(definition("dspark").space, 300)
    for point in points:
        assert (point["controller"] == "dspark") == (SCHEDULER <= set(point)), point
        if point["controller"] != "dspark":
            assert not SCHEDULER & set(point)
        else:
            assert point["k_min"] <= point["k_max"] <= 8
            assert point["grow_above"] >= point["shrink_below"] + 0.05 - 1e-12
        DSparkOptions(**{k: v for k, v in point.items() if k != "controller"})  # never infeasible
    assert {p["controller"] for p in points} == {"dspark", "fixed", "heuristic", "entropy"}


def test_fix_prefix_and_fingerprint():
    space = SearchSpace((
        Param("mode", Choice(("a", "b"))),
        Param("lo", IntRange(1, 8), When("mode", ("a",))),
        Param("hi", IntRange(Ref("lo"), 8), When("mode", ("a",))),
        Param("rate", FloatRange(0.1, 1.0, log=True)),
    ))
    assert space.describe()["hi"] == "lo..8 if mode = a"
    only_b = space.fix("mode", "b")
    assert only_b.names == ("rate",)
    fixed_lo = space.fix("mode", "a").fix("lo", 3)
    assert fixed_lo.names == ("hi", "rate") and fixed_lo.params[0].domain.low == 3
    prefixed = space.prefixed("m.")
    assert prefixed.names == ("m.mode", "m.lo", "m.hi", "m.rate")
    assert prefixed.params[2].domain.low == Ref("m.lo") and prefixed.params[1].when == When("m.mode", ("a",))
    assert all(p["m.lo"] <= p["m.hi"] for p in sample(prefixed, 50) if p["m.mode"] == "a")
    assert space.fingerprint() == SearchSpace(space.params).fingerprint() != only_b.fingerprint()
    with pytest.raises(SpecbenchError, match="outside its search range"):
        space.point({"mode": "a", "lo": 9, "hi": 9, "rate": 0.5})


def test_ranges_come_from_the_metadata():
    with pytest.raises(SpecbenchError, match=r"dspark.gamma must be above 0"):
        DSparkOptions(gamma=0.0)
    with pytest.raises(SpecbenchError, match=r"mtp.entropy_threshold must be at least 0, got nan"):
        definition("mtp").options(entropy_threshold=float("nan"))
    assert knob_infos(DSparkOptions)["confidence_threshold"].valid_text() == "0..1"


def test_controllers_own_their_knobs():
    """Each controller's knobs are its own dataclass's, described like a strategy's; a strategy's knobs of
    those names set them (dspark's options are the scheduler's knobs too), the defaults stand elsewhere."""
    assert set(CONTROLLERS["dspark"].knob_names) == SCHEDULER
    assert CONTROLLERS["entropy"].knob_names == ("entropy_threshold",)
    for name, controller in CONTROLLERS.items():
        if controller.knobs:
            assert set(knob_infos(controller.knobs)) == set(controller.knob_names), name
    assert SCHEDULER <= set(knob_infos(DSparkOptions))
    assert CONTROLLERS["entropy"](3, definition("mtp").options(entropy_threshold=3.5)).threshold == 3.5
    assert CONTROLLERS["entropy"](3, definition("ngram").options()).threshold == 2.1
    assert CONTROLLERS["dspark"](3, DSparkOptions(window_size=20, k_max=4)).history.maxlen == 20
    with pytest.raises(SpecbenchError, match="entropy_threshold must be at least 0"):
        CONTROLLERS["entropy"](3, SimpleNamespace(entropy_threshold=-1.0))


def test_strategies_command_lists_knobs_spaces_and_controllers():
    result = CliRunner().invoke(app, ["strategies", "--json"])
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    by_name = {s["name"]: s for s in listing["strategies"]}
    assert list(by_name) == ["ar", *DRAFTER_NAMES]  # ngram, draft, eagle, mtp, dflash, dspark, ...
    window = next(k for k in by_name["dspark"]["knobs"] if k["name"] == "window_size")
    assert window == {"name": "window_size", "default": 64, "unit": "verifications", "valid": ">= 1",
                      "search": "16..256 log if controller = dspark", "architecture": False,
                      "description": window["description"]}
    assert {c["name"] for c in listing["controllers"]} == {"fixed", "heuristic", "entropy", "dspark"}
    assert {c["name"]: set(c["reads"]) for c in listing["controllers"]}["dspark"] == SCHEDULER
    text = CliRunner().invoke(app, ["strategies"])
    assert text.exit_code == 0 and "| window_size" in text.output and "## controllers" in text.output


def test_a_combination_tunes_how_it_combines_and_every_point_is_valid():
    spec = parse_strategy("eagle+suffix")
    fixed = study_space(spec, None, {"combine": {"explore": 4}}, None, "specbench")
    names = set(fixed.space.names)
    assert {"combine.mode", "combine.budget", "combine.router", "combine.entropy_low", "combine.entropy_high"} <= names
    assert "combine.explore" not in names  # the workload holds it
    assert fixed.defaults()["combine.mode"] == CombineOptions().mode
    points = sample(COMBINE_SPACE, 300)
    for point in points:
        if point.get("router") == "entropy":
            assert point["entropy_low"] <= point["entropy_high"]  # the hysteresis never inverted
        CombineOptions(**point)  # never infeasible
    assert {p["mode"] for p in points} == set(MODES) and {p.get("router") for p in points} >= set(ROUTERS)
    knobs, _ = fixed.run_settings({"combine.mode": "budget", "eagle.depth": 3})
    assert knobs["combine"] == {"explore": 4, "mode": "budget"} and knobs["eagle"] == {"depth": 3}
