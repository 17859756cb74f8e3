"""Turning tokenised chats into micro-batches: padded, or packed without padding.

Length-grouped batches (transformers' `group_by_length`) sort each shuffled mega-batch of
samples by length before cutting it into batches, so a padded batch holds samples of similar
length and little compute goes to padding; the batches are then shuffled.

Packing groups samples into blocks of at most `block_size` tokens; a packed micro-batch lays
its blocks' samples end to end in ONE row, with no padding at all (transformers'
DataCollatorWithFlattening): position ids restart at 0 for every sample and the sample
boundaries travel as `cu_seq_lens_q`/`_k`, so attention stays inside each sample, either
through transformers' mask derived from the position ids or, cheaper, through
reasonrl.training.packed_attention. Micro-batch i is a pure function of i (epoch
permutations come from the seed), which is what makes resume exact.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache

import torch
from transformers import DataCollatorWithFlattening

from reasonrl.chat import TokenizedChat

IGNORE = -100
# The boundaries of a packed row, for attention functions that run sample by sample.
PACKED_INPUTS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
# Batches per mega-batch that is sorted by length (transformers' LengthGroupedSampler: 50).
MEGA_BATCH_BATCHES = 50


def _labels(sample: TokenizedChat) -> list[int]:
    labels = sample.labels
    labels[0] = IGNORE  # never predict a sample's first token from the previous sample
    return labels


def pack(samples: Sequence[TokenizedChat], block_size: int) -> list[list[TokenizedChat]]:
    """Greedily group samples, in order, into blocks of at most `block_size` tokens (a longer
    sample is cut to `block_size`)."""
    blocks: list[list[TokenizedChat]] = []
    size = block_size
    for sample in samples:
        sample = sample.truncated(block_size)
        if size + len(sample.input_ids) > block_size:
            blocks.append([])
            size = 0
        blocks[-1].append(sample)
        size += len(sample.input_ids)
    return blocks


def flatten(samples: Sequence[TokenizedChat]) -> dict[str, torch.Tensor]:
    """One padding-free row of `samples` end to end: input ids, labels (no sample's first token
    is predicted, so none from the previous sample), restarting position ids and boundaries."""
    collate = DataCollatorWithFlattening(return_flash_attn_kwargs=True, separator_id=IGNORE)
    batch = collate([{"input_ids": s.input_ids, "labels": s.labels} for s in samples])
    batch["num_tokens"] = torch.tensor([batch["input_ids"].shape[1]])
    return dict(batch)


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
            self.items = pack(shuffled, block_size)
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
            return flatten([sample for block in chosen for sample in block])
        return pad_batch(chosen, self.pad_id)
