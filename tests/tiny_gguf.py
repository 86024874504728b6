"""A tiny Llama written as llama.cpp writes GGUF files, and a fake installed package that ships one.

The tensor names, the metadata keys and the q/k row permutation follow llama.cpp's
convert_hf_to_gguf.py (LlamaModel); the tokenizer is its `gpt2` (byte-level BPE) vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.helpers import write_tiny_model_dir

TEXT = " ".join(f"the quick brown fox {i} jumps over the lazy dog {i % 7}; def f{i}(x): return x" for i in range(300))


def permute(weights: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """llama.cpp's q/k row order (its rotary pairs are interleaved, HF's are split in halves)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def write_gguf(model_dir: Path, path: Path) -> None:
    """The HF Llama in `model_dir` as a float32 GGUF file at `path`."""
    import gguf

    model = LlamaForCausalLM.from_pretrained(model_dir)
    c = model.config
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    vocab = tokenizer["model"]["vocab"] | {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    tokens = sorted(vocab, key=vocab.get)
    special = {t["content"] for t in tokenizer["added_tokens"]}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    writer.add_vocab_size(c.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]])
    writer.add_eos_token_id(vocab[tokenizer_config["eos_token"]])
    writer.add_bos_token_id(vocab["<|endoftext|>"])
    writer.add_pad_token_id(vocab["<|endoftext|>"])
    chat_template = model_dir / "chat_template.jinja"
    writer.add_chat_template(chat_template.read_text() if chat_template.exists() else tokenizer_config["chat_template"])
    state = {k: v.float().numpy() for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        layer = f"model.layers.{i}."
        names = {"attn_norm": "input_layernorm", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                 "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj"}
        writer.add_tensor(f"blk.{i}.attn_q.weight", permute(state[layer + "self_attn.q_proj.weight"],
                                                            c.num_attention_heads, c.num_attention_heads))
        writer.add_tensor(f"blk.{i}.attn_k.weight", permute(state[layer + "self_attn.k_proj.weight"],
                                                            c.num_attention_heads, c.num_key_value_heads))
        for theirs, ours in names.items():
            writer.add_tensor(f"blk.{i}.{theirs}.weight", state[layer + ours + ".weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    if not c.tie_word_embeddings:
        writer.add_tensor("output.weight", state["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tiny_llama_gguf(folder: Path) -> tuple[Path, Path]:
    """A tiny tied-embedding Llama directory and its GGUF file, both under `folder`."""
    model_dir = write_tiny_model_dir(folder / "hf", TEXT, classes=(LlamaConfig, LlamaForCausalLM), tie=True)
    path = folder / "tiny.gguf"
    write_gguf(Path(model_dir), path)
    return Path(model_dir), path


def install_fake_package(site: Path, package: str, files: dict[str, Path]) -> None:
    """An installed distribution `package` (a .dist-info with a RECORD) shipping `files` (its path -> a file
    to copy there), found by importlib.metadata once `site` is on sys.path."""
    info = site / f"{package.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    for name, source in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(Path(source).read_bytes())
    (info / "RECORD").write_text("".join(f"{name},,\n" for name in files) + f"{info.name}/METADATA,,\n")


def same_logits(a: torch.nn.Module, b: torch.nn.Module, vocab: int) -> bool:
    ids = torch.arange(min(vocab, 40))[None]
    with torch.no_grad():
        return torch.allclose(a(input_ids=ids).logits, b(input_ids=ids).logits, atol=1e-5)
