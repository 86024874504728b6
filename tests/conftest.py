"""Fixtures over tests/helpers.py: tiny random-weight models built locally (real transformers classes, no
download), on disk and in memory."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from specbench.decoding.target import Target, load_target
from tests.helpers import TINY_SHAPES, tiny_lm, tiny_target, write_tiny_model_dir

# tiny models: one thread is faster than two, and the suite stays fast on a loaded 2-core machine
torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The vLLM tests first: theirs is the longest file (every vLLM engine starts processes of its own), and
    with CI's two workers (.ci/run) the longest file handed out last would leave the other one idle at the end."""
    items.sort(key=lambda item: item.get_closest_marker("vllm") is None)


@pytest.fixture(params=list(TINY_SHAPES))
def target(request) -> Target:
    return tiny_target(request.param)


@pytest.fixture(scope="session")
def deep_target() -> Target:
    """A deeper tiny target, for drafters that read features of several layers (published layouts)."""
    return Target(tiny_lm("qwen3-gqa", layers=6), None, "tiny-qwen3-6", frozenset())


@pytest.fixture(scope="session")
def default_target() -> Target:
    """The embedded default model, which ships with the package (never skipped: its absence is a broken checkout)."""
    return load_target(None, torch.device("cpu"), torch.float32)


@pytest.fixture
def float32_drafting(monkeypatch):
    """Two implementations' drafts compared exactly: in float32, as on a CPU without native bfloat16 (in
    bfloat16 their different orders of summation round near-ties apart)."""
    import specbench.methods.base

    monkeypatch.setattr(specbench.methods.base, "bf16_native", lambda device: False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    text = " ".join(f"def f{i}(x): return x + {i} # the quick brown fox {i % 7}" for i in range(400))
    return write_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "target", text)


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory, tiny_model_dir):
    return write_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "draft", "", hidden=32, layers=1, seed=1,
                                tokenizer_from=tiny_model_dir)


@pytest.fixture(scope="session")
def vllm_installed() -> None:
    """For the tests marked `vllm`: skipped where vLLM is absent, a failure in CI, which installs it."""
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("CI"):
            pytest.fail("vLLM is not installed: CI installs the vllm extra, and its tests never skip there")
        pytest.skip("vLLM is not installed (pip install -e '.[vllm]')")
