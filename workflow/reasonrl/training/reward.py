"""The Bradley-Terry reward-model loss and its pair batches."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from reasonrl.errors import ReasonRLError


def bradley_terry_loss(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
    """-log sigma(r_w - r_l), mean over pairs; the first half of the batch is the chosen side."""
    rewards = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).logits[:, 0]
    chosen, rejected = rewards.float().chunk(2)
    loss = -F.logsigmoid(chosen - rejected).mean()
    stats = {
        "accuracy": float((chosen > rejected).float().mean().detach()),
        "margin": float((chosen - rejected).mean().detach()),
        "tokens": float(batch["attention_mask"].sum()),
    }
    return loss, stats


class PairBatches:
    """Micro-batch i of preference pairs, a pure function of i (as MicroBatches): chosen rows
    first, then the rejected rows in the same order, right-padded to one width."""

    def __init__(
        self, pairs: list[tuple[list[int], list[int]]], batch_size: int, pad_id: int, seed: int
    ):
        if not pairs:
            raise ReasonRLError("no preference pairs to train on")
        self.pairs, self.batch_size, self.pad_id, self.seed = pairs, batch_size, pad_id, seed
        self.per_epoch = max(1, len(pairs) // batch_size)

    def __call__(self, index: int) -> dict[str, torch.Tensor]:
        epoch, position = divmod(index, self.per_epoch)
        order = list(range(len(self.pairs)))
        random.Random(self.seed * 100_003 + epoch).shuffle(order)
        chosen = [self.pairs[j] for j in order[position * self.batch_size :][: self.batch_size]]
        rows = [c for c, _ in chosen] + [r for _, r in chosen]
        width = max(map(len, rows))
        return {
            "input_ids": torch.tensor([r + [self.pad_id] * (width - len(r)) for r in rows]),
            "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
        }
