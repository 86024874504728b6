"""The embedded drafters, written in vLLM's layouts, load and run in real vLLM (CPU, float32), losslessly."""

from __future__ import annotations

import pytest
import torch

vllm = pytest.importorskip("vllm")

from specbench.models import ASSETS, encode_turns, load_target  # noqa: E402
from specbench.strategies.published.to_vllm import method, vllm_drafter_dir  # noqa: E402

pytestmark = pytest.mark.vllm
TOKENS = 12


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """Plain greedy decoding with transformers (float32), eos ignored as in the vLLM request below."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("strategy,k", [("eagle", 3), ("dflash", 7)])
def test_converted_drafter_runs_in_vllm(tmp_path, monkeypatch, strategy, k):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    target = load_target(None, torch.device("cpu"), torch.float32)
    prompt = encode_turns(target.tokenizer, ["Write a Python function that reverses a list."], [])
    expected = greedy(target.model, prompt, TOKENS)
    model = vllm_drafter_dir(strategy, None, target, tmp_path)
    llm = vllm.LLM(model=str(ASSETS / "default" / "target"), dtype="float32", enforce_eager=True,
                   max_model_len=512, max_num_seqs=1, disable_log_stats=False,
                   speculative_config={"method": method(strategy), "model": str(model), "num_speculative_tokens": k})
    out = llm.generate([vllm.TokensPrompt(prompt_token_ids=prompt)],
                       vllm.SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True), use_tqdm=False)
    drafts = sum(m.value for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_drafts")
    assert list(out[0].outputs[0].token_ids) == expected
    assert drafts > 0
