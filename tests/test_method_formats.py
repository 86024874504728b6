"""A learned method with a published checkpoint format and a vLLM form is its own modules and one registry
line: the toy method below is written into throw-away files, registered with one line in MODULES, and
detected, loaded, given its knob defaults and exported for vLLM with no other file naming it."""

import sys

import pytest
import torch

import specbench.methods as strategies_package
import specbench.methods.published as published_package
import specbench.methods.published.formats as formats_package
from specbench.engines.vllm import translate
from specbench.methods import published, registry
from specbench.methods.names import StrategyName
from specbench.methods.published import to_vllm
from specbench.methods.published.formats import open_source
from tests.published_layouts import write

TOY_FORMATS = '''
from specbench.methods.published.formats import Format

FORMATS = (Format("toy-v1", "a toy drafter (toy-lab)", detect=lambda c: "toy_config" in c.config, code="toy_code",
                  vllm_as_is=True, vllm_writer="toy_code.export"),)
'''
TOY_CODE = '''
def knob_defaults(source):
    return {"depth": 2}


def load(source, target, options):
    return ("toy drafter", source.format, options)


def export(source, target, out, mask_token_id):
    (out / "exported").write_text(source.strategy)
    return "exported"
'''
TOY_METHOD = '''
import dataclasses

from specbench.methods.eagle import STRATEGY as EAGLE

STRATEGY = dataclasses.replace(EAGLE, name="toy")
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy's three modules where the method, format and format-code modules go, and its registry line."""
    for package, name, text in ((strategies_package, "toy", TOY_METHOD),
                                (published_package, "toy_formats", TOY_FORMATS),
                                (published_package, "toy_code", TOY_CODE)):
        folder = tmp_path / package.__name__
        folder.mkdir(exist_ok=True)
        (folder / f"{name}.py").write_text(text)
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
    monkeypatch.setitem(registry.MODULES, "toy", "toy")  # the one registry line
    names = tuple(registry.MODULES)  # DRAFTER_NAMES, as the registry derives it at import
    for module in (registry, formats_package, to_vllm):
        monkeypatch.setattr(module, "DRAFTER_NAMES", names)
    registry.definition.cache_clear()
    registry.formats.cache_clear()
    yield
    registry.definition.cache_clear()
    registry.formats.cache_clear()
    for name in ("specbench.methods.toy", "specbench.methods.published.toy_formats",
                 "specbench.methods.published.toy_code"):
        sys.modules.pop(name, None)


def checkpoint(path, config):
    return write(path, config, {"w.weight": torch.zeros(2)})


def test_a_new_method_declares_its_formats_and_vllm_form_in_its_own_modules(toy, tmp_path):
    source = open_source(checkpoint(tmp_path / "published", {"toy_config": {}}))
    assert (source.strategy, source.format, source.published) == ("toy", "toy-v1", True)
    assert source.describe()["description"] == "a toy drafter (toy-lab)"
    assert published.knob_defaults(source) == {"depth": 2}
    assert published.load(source, None, "options") == ("toy drafter", "toy-v1", "options")
    with pytest.raises(Exception, match="which vLLM loads as it is"):
        to_vllm.to_vllm(source, None, tmp_path / "out")

    own = open_source(checkpoint(tmp_path / "own", {"specbench_strategy": "toy"}))
    (tmp_path / "out").mkdir()
    assert to_vllm.to_vllm(own, None, tmp_path / "out") == "exported"
    assert (tmp_path / "out" / "exported").read_text() == "toy"
    assert translate(StrategyName(("toy",)), {}, None, {}).speculative_config["method"] == "eagle3"


def test_the_formats_each_method_declares_agree_with_it():
    for name in registry.DRAFTER_NAMES:
        declared = registry.formats(name)
        assert all(fmt.code is None or fmt.detect is not None or fmt.builtin for fmt in declared), name
        assert sum(fmt.vllm_writer is not None for fmt in declared) <= 1, name
        assert registry.definition(name).vllm_drafter or not any(fmt.vllm_writer for fmt in declared), name
