"""The engine seam (engines/protocol.py): what every engine provides, the capabilities only some declare,
the plan they are made from and the reference engine the plan names."""

import ast
from pathlib import Path

import pytest

import specbench.engines
from specbench.core.errors import SpecbenchError
from specbench.engines.engine_registry import ENGINE_NAMES, REFERENCE, backend, run_order
from specbench.engines.protocol import Deploys, KeepsLog, TimesTarget, Tunable
from specbench.plan.run_config import RunConfig
from specbench.tuning import study_config as tune_config
from specbench.tuning.study_config import TuneConfig

CAPABILITIES = {  # engine -> the optional capabilities it declares
    "specbench": {Tunable},
    "transformers": {Tunable, Deploys},
    "vllm": {Tunable, TimesTarget, Deploys, KeepsLog},
}


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_every_engine_has_the_seam_and_declares_its_capabilities(name):
    engine = backend(name)
    for member in ("check", "start", "decode", "report", "close"):
        assert callable(getattr(engine, member)), member
    declared = {c for c in (Tunable, TimesTarget, Deploys, KeepsLog) if issubclass(engine, c)}
    assert declared == CAPABILITIES[name]


def test_no_engine_imports_the_run_configuration():
    """Engines are made from an EnginePlan (their layer), never from plan/run_config.py's RunPlan (the layer above)."""
    for module in Path(specbench.engines.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module != "specbench.plan.run_config", module.name


def test_the_reference_engine_is_the_plans(tiny_model_dir):
    plan = RunConfig(model=str(tiny_model_dir), strategies=["ngram"], engine="transformers").plan()
    assert plan.reference == REFERENCE == "specbench"
    assert plan.engine.specs == plan.strategies and plan.engine.model == plan.model
    assert run_order(plan.engines, plan.reference) == ("specbench", "transformers")
    assert run_order(("vllm", "specbench"), "vllm") == ("vllm", "specbench")


def test_tune_refuses_an_engine_that_is_not_tunable(tiny_model_dir, monkeypatch):
    class Untunable:
        """An engine with the seam alone."""

    monkeypatch.setattr(tune_config, "backend", lambda name: Untunable)
    workload = RunConfig(model=str(tiny_model_dir), limit=4)
    with pytest.raises(SpecbenchError, match="tune cannot measure in it"):
        TuneConfig(workload, ("ngram",), trials=2).validate()
