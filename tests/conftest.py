"""Tiny random-weight models built locally: real transformers classes, no download."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from specbench.models import Target

# tiny models: one thread is faster than two, and the suite stays fast on a loaded 2-core machine
torch.set_num_threads(1)

TINY_SHAPES = {
    # name: (config class, model class, vocab, kv heads)
    "qwen3-gqa": (Qwen3Config, Qwen3ForCausalLM, 97, 2),
    "llama-mha": (LlamaConfig, LlamaForCausalLM, 211, 4),
    "qwen3-mqa": (Qwen3Config, Qwen3ForCausalLM, 512, 1),
}


def tiny_lm(shape: str = "qwen3-gqa", seed: int = 0, layers: int = 2, hidden: int = 64) -> torch.nn.Module:
    config_cls, model_cls, vocab, kv_heads = TINY_SHAPES[shape]
    torch.manual_seed(seed)
    config = config_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=kv_heads,
                        head_dim=hidden // 4, max_position_embeddings=512, initializer_range=0.3,
                        tie_word_embeddings=False, attn_implementation="sdpa")
    return model_cls(config).eval()


def tiny_target(shape: str = "qwen3-gqa", seed: int = 0, eos: int | None = None) -> Target:
    model = tiny_lm(shape, seed)
    eos_ids = frozenset({eos} if eos is not None else ())
    return Target(model, tokenizer=None, name=f"tiny-{shape}-{seed}", eos_ids=eos_ids)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The vLLM tests first: theirs is the longest file (every vLLM engine starts processes of its own), and
    with CI's two workers (.ci/run) the longest file handed out last would leave the other one idle at the end."""
    items.sort(key=lambda item: item.get_closest_marker("vllm") is None)


@pytest.fixture(params=list(TINY_SHAPES))
def target(request) -> Target:
    return tiny_target(request.param)


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def write_tiny_model_dir(path, vocab_text: str, hidden: int = 64, layers: int = 2, seed: int = 0, tokenizer_from=None):
    """A real on-disk HF model directory (config, safetensors, tokenizer with a chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if tokenizer_from is None:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|end|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator([vocab_text], trainer)
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|endoftext|>")
        tokenizer.chat_template = CHAT_TEMPLATE
    else:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_from)
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=hidden // 4, max_position_embeddings=1024, initializer_range=0.3,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    Qwen3ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


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
