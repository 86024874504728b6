"""Rebuild the embedded default model: tokenizer, target LM and `draft` LM.

The corpus is text every machine with Python has: the standard library's own source. Functions
with docstrings also become chat-formatted instruction/answer pairs so that the model answers
suite prompts in the chat template it ships with. Everything is seeded; the result is written to
specbench/assets/default/{target,draft} as bfloat16 safetensors (loaded as float32).

    python scripts/build_default_model.py                  # tokenizer + target + draft
    python scripts/build_default_model.py --only draft     # retrain the draft LM only
    python scripts/build_default_model.py --out /tmp/m --corpus-bytes 200000 --target-steps 2 --draft-steps 2

The drafters of the other strategies are trained against this target by
scripts/build_default_drafters.py.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import random
import sys
import sysconfig
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

ASSETS = Path(__file__).resolve().parents[1] / "specbench" / "assets" / "default"
SPECIALS = ["<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>\n{{ m['content'] }}<|end|>\n"
    "{% elif m['role'] == 'assistant' %}<|assistant|>\n{{ m['content'] }}<|end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
VOCAB_SIZE = 4096
CORPUS_BYTES = 12_000_000
SEQ_LEN = 256

# Deep and narrow, like real LLMs: on a CPU a forward's cost grows with the layer count more than with
# the tokens it verifies, and a one-layer drafter of this width is cheap beside 13 target layers.
TARGET = dict(hidden_size=320, num_hidden_layers=13, num_attention_heads=5, num_key_value_heads=1,
              head_dim=64, intermediate_size=1280)
DRAFT = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=64, intermediate_size=768)


def stdlib_sources(corpus_bytes: int = CORPUS_BYTES) -> list[tuple[str, str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "site-packages", "idlelib", "lib2to3", "turtledemo", "__pycache__"}
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [s for s in subfolders if s not in skip]  # never walk into site-packages
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    files.sort()
    out, total = [], 0
    for path in files:
        text = path.read_text(encoding="utf-8", errors="ignore")
        if total + len(text) > corpus_bytes:
            break
        out.append((str(path.relative_to(root)), text))
        total += len(text)
    return out


def instruction_pairs(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    pairs = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        body = ast.get_source_segment(source, node)
        if not doc or not body or len(body) > 1500:
            continue
        args = ", ".join(a.arg for a in node.args.args)
        ask = f"Write a Python function `{node.name}({args})`. {doc.strip().splitlines()[0]}"
        pairs.append(f"<|user|>\n{ask}<|end|>\n<|assistant|>\n{body}<|end|>\n")
    return pairs


def training_texts(corpus_bytes: int = CORPUS_BYTES) -> list[str]:
    texts = []
    for _, source in stdlib_sources(corpus_bytes):
        texts.append(source + "<|endoftext|>")
        texts.extend(instruction_pairs(source))
    random.Random(0).shuffle(texts)
    return texts


def build_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|end|>",
                                   pad_token="<|endoftext|>", unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def token_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
    return torch.tensor(ids, dtype=torch.long)


def train_lm(arch: dict, tokenizer, stream: torch.Tensor, steps: int, batch: int, lr: float,
             seed: int, out_dir: Path) -> dict:
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tokenizer), tie_word_embeddings=True, max_position_embeddings=2048,
                         rope_theta=10000.0, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None, **arch)
    model = Qwen3ForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / steps))))
    gen = torch.Generator().manual_seed(seed)
    started, losses = time.time(), []
    model.train()
    for step in range(steps):
        starts = torch.randint(0, len(stream) - SEQ_LEN - 1, (batch,), generator=gen)
        x = torch.stack([stream[s:s + SEQ_LEN] for s in starts.tolist()])
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 20 == 0 or step == steps - 1:
            print(f"{out_dir.name} step {step}/{steps} loss {loss.item():.3f} "
                  f"({time.time() - started:.0f}s)", flush=True)
    model.eval()
    model.to(torch.bfloat16).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"parameters": params, "steps": steps, "batch": batch, "seq_len": SEQ_LEN, "lr": lr,
            "seed": seed, "final_loss": sum(losses[-20:]) / len(losses[-20:]),
            "train_seconds": round(time.time() - started)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["target", "draft"])
    parser.add_argument("--target-steps", type=int, default=1200)
    parser.add_argument("--draft-steps", type=int, default=400)
    parser.add_argument("--corpus-bytes", type=int, default=CORPUS_BYTES, help="standard-library source to train on")
    parser.add_argument("--out", type=Path, default=ASSETS, help="where target/ and draft/ go")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    texts = training_texts(args.corpus_bytes)
    if args.only == "draft":
        tokenizer = PreTrainedTokenizerFast.from_pretrained(args.out / "target")
    else:
        tokenizer = build_tokenizer(texts)
    stream = token_stream(tokenizer, texts)
    print(f"corpus: {len(texts)} texts, {len(stream)} tokens", flush=True)

    build_file = args.out / "BUILD.json"
    record = json.loads(build_file.read_text()) if build_file.exists() else {}
    record["python"] = sys.version.split()[0]
    record["torch"] = torch.__version__
    record["corpus_tokens"] = len(stream)
    if args.only != "draft":
        record["target"] = train_lm(TARGET, tokenizer, stream, args.target_steps, 8, 2e-3, 0, args.out / "target")
    if args.only != "target":
        record["draft"] = train_lm(DRAFT, tokenizer, stream, args.draft_steps, 8, 3e-3, 1, args.out / "draft")
    build_file.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
