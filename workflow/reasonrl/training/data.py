"""Turning tokenised chats into micro-batches: padded, or packed into fixed-length blocks.

Length-grouped batches (transformers' `group_by_length`) sort each shuffled mega-batch of
samples by length before cutting it into batches, so a padded batch holds samples of similar
length and little compute goes to padding; the batches are then shuffled.

Packed blocks carry position ids that restart at 0 for every sample; with no attention mask,
transformers builds a block-diagonal causal mask from them, so attention stays inside each
sample. Micro-batch i is a pure function of i (epoch permutations come from the seed), which
is what makes resume exact.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache

import torch

from reasonrl.chat import TokenizedChat

IGNORE = -100
# Batches per mega-batch that is sorted by length (transformers' LengthGroupedSampler: 50).
MEGA_BATCH_BATCHES = 50


def _labels(sample: TokenizedChat) -> list[int]:
    labels = sample.labels
    labels[0] = IGNORE  # never predict a sample's first token from the previous sample
    return labels


def pack(samples: Sequence[TokenizedChat], block_size: int, pad_id: int) -> list[dict]:
    """Greedily pack samples in order into blocks of exactly `block_size` tokens."""
    blocks: list[dict] = []
    ids: list[int] = []
    labels: list[int] = []
    positions: list[int] = []

    def close() -> None:
        fill = block_size - len(ids)
        blocks.append(
            {
                "input_ids": ids + [pad_id] * fill,
                "labels": labels + [IGNORE] * fill,
                "position_ids": positions + list(range(fill)),
                "num_tokens": len(ids),
            }
        )

    for sample in samples:
        sample_ids = sample.input_ids[:block_size]
        if len(ids) + len(sample_ids) > block_size:
            close()
            ids, labels, positions = [], [], []
        ids += sample_ids
        labels += _labels(sample)[:block_size]
        positions += list(range(len(sample_ids)))
    if ids:
        close()
    return blocks


def pad_batch(samples: Sequence[TokenizedChat], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(s.input_ids) for s in samples)
    rows = [(s.input_ids, _labels(s), width - len(s.input_ids)) for s in samples]
    return {
        "input_ids": torch.tensor([ids + [pad_id] * fill for ids, _, fill in rows]),
        "labels": torch.tensor([lab + [IGNORE] * fill for _, lab, fill in rows]),
        "attention_mask": torch.tensor([[1] * (width - fill) + [0] * fill for *_, fill in rows]),
        "num_tokens": torch.tensor([width - fill for *_, fill in rows]),
    }


class MicroBatches:
    """Deterministic micro-batch i: epoch = i // per_epoch, order shuffled per epoch by seed."""

    def __init__(
        self,
        samples: Sequence[TokenizedChat],
        batch_size: int,
        pad_id: int,
        seed: int,
        packing: bool,
        block_size: int,
        group_by_length: bool = False,
    ):
        if not samples:
            raise ValueError("no training samples")
        self.seed = seed
        self.batch_size = batch_size
        self.pad_id = pad_id
        self.packing = packing
        self.group_by_length = group_by_length and not packing
        if packing:
            shuffled = list(samples)
            random.Random(seed).shuffle(shuffled)
            self.items = pack(shuffled, block_size, pad_id)
        else:
            self.items = list(samples)
        self.per_epoch = max(1, len(self.items) // batch_size)
        self._epoch_batches = lru_cache(maxsize=2)(self._batches_of_epoch)

    def _batches_of_epoch(self, epoch: int) -> list[list[int]]:
        rng = random.Random(self.seed * 100_003 + epoch)
        order = list(range(len(self.items)))
        rng.shuffle(order)
        if not self.group_by_length:
            return [order[b * self.batch_size :][: self.batch_size] for b in range(self.per_epoch)]
        used = order[: self.per_epoch * self.batch_size]
        size = self.batch_size
        mega = size * MEGA_BATCH_BATCHES
        batches = []
        for start in range(0, len(used), mega):
            chunk = sorted(used[start : start + mega], key=lambda j: len(self.items[j].input_ids))
            batches += [chunk[b : b + size] for b in range(0, len(chunk), size)]
        rng.shuffle(batches)
        return batches

    def __call__(self, index: int) -> dict[str, torch.Tensor]:
        epoch, position = divmod(index, self.per_epoch)
        chosen = [self.items[j] for j in self._epoch_batches(epoch)[position]]
        if self.packing:
            return {k: torch.tensor([c[k] for c in chosen]) for k in chosen[0]}
        return pad_batch(chosen, self.pad_id)
