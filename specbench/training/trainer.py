"""The training loop shared by every drafter: checkpoints, resume, atomic save.

A trainable drafter is an nn.Module following `strategies.trainable.TrainableDrafter`: `hidden_layers`,
`training_loss(batch) -> scalar` and `drafter_config() -> dict`; its state_dict holds only its own
weights (the target's embedding and LM head are used, not registered).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Callable

import torch

from specbench.core.errors import Interrupted
from specbench.core.files import atomic_path
from specbench.methods.draft_vocab import DraftVocab, frequent_tokens
from specbench.methods.drafter_dir import save_drafter
from specbench.training.distill import DistillSequence, make_batch
from specbench.training.settings import partial_dir

MAX_LEN = 256  # positions of a training sequence: a few before its answer, then the answer


def choose_vocabulary(model: torch.nn.Module, sequences: list[DistillSequence]) -> None:
    """A drafter with a reduced draft vocabulary scores the tokens its target answers with most."""
    vocab = getattr(model, "vocab", None)
    if isinstance(vocab, DraftVocab) and not vocab.full:
        answers = [s.input_ids[s.answer_start:].tolist() for s in sequences]
        vocab.set_ids(frequent_tokens(answers, vocab.size, vocab.vocab))


def train(model: torch.nn.Module, sequences: list[DistillSequence], out_dir: Path, strategy: str,
          fingerprint: str, steps: int, batch_size: int = 8, lr: float = 1e-3, max_len: int = MAX_LEN,
          seed: int = 0, checkpoint_every: int = 50,
          on_step: Callable[[int, float], None] | None = None, decay: bool = False,
          evaluate: Callable[[int, Path], bool | None] | None = None, evaluate_every: int = 0,
          bf16: bool = False) -> list[float]:
    """Train `model` for `steps` optimizer steps at most, resuming from the last checkpoint if there is one.

    The learning rate warms up over the first 5% of the steps, then stays, or with `decay` falls along a
    cosine to a tenth. With `bf16` the forward's products run in bfloat16 (autocast; the weights, their
    gradients and the optimizer stay float32, the losses' softmaxes are taken in float32). Every
    `evaluate_every` steps and at the end, `evaluate(step, drafter_dir)` gets the drafter as it is, saved
    as a drafter directory; where it answers False (its held-out acceptance has reached a plateau), training
    ends there. On KeyboardInterrupt, `Interrupted` says which checkpoint was kept.
    """
    work = partial_dir(out_dir)
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = work / "checkpoint.pt"
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, decay))
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    start = 0
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        start, losses = state["step"], state["losses"]
    else:
        choose_vocabulary(model, sequences)
    model.train()
    saved = start
    plateau = False
    try:
        for step in range(start, steps):
            picks = torch.randint(len(sequences), (batch_size,), generator=generator).tolist()
            with torch.autocast(device.type, torch.bfloat16, enabled=bf16):
                loss = model.training_loss(make_batch([sequences[i] for i in picks], max_len, device))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            if on_step:
                on_step(step + 1, losses[-1])
            if evaluate and evaluate_every and (step + 1) % evaluate_every == 0 and step + 1 < steps:
                snapshot = work / "evaluated"  # replaced whole by each save (atomic_path)
                save_drafter(snapshot, strategy, model.drafter_config(), model.state_dict(), fingerprint)
                model.eval()
                if evaluate(step + 1, snapshot) is False:
                    steps, plateau = step + 1, True
                    break
                model.train()
            if (step + 1) % checkpoint_every == 0 and step + 1 < steps:
                with atomic_path(checkpoint) as tmp:
                    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                "scheduler": sched.state_dict(), "generator": generator.get_state(),
                                "torch_rng": torch.get_rng_state(), "step": step + 1, "losses": losses}, tmp)
                saved = step + 1
    except KeyboardInterrupt as exc:
        kept = (f"the checkpoint of step {saved} of {steps}" if saved else
                f"no checkpoint yet (training restarts from step 0; one is written every {checkpoint_every} steps)")
        raise Interrupted(work, kept) from exc
    model.eval()
    config = {**model.drafter_config(), "training": {"steps": steps, "batch_size": batch_size, "lr": lr,
                                                     "seed": seed, "bf16": bf16,
                                                     "final_loss": sum(losses[-10:]) / max(1, len(losses[-10:]))}}
    save_drafter(out_dir, strategy, config, model.state_dict(), fingerprint)
    shutil.rmtree(work, ignore_errors=True)
    if evaluate and not plateau:  # the finished drafter itself (at a plateau, the snapshot just evaluated)
        evaluate(steps, out_dir)
    return losses


def lr_factor(step: int, steps: int, decay: bool) -> float:
    """Linear warm-up over 5% of the steps; then 1, or a cosine from 1 down to 0.1."""
    warmup = max(1, steps // 20)
    if step < warmup:
        return (step + 1) / warmup
    if not decay:
        return 1.0
    return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))
