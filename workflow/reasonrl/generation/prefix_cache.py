"""Key/value states kept between the turns of a multi-turn conversation (HF engine).

A tool-loop turn's prompt is the previous turn's prompt and completion plus the tool output:
re-encoding it all (prefill) cost about as much as the turn's decoding. The engine keeps, for
each row of its previous call, the tokens it saw and their key/value states; a new prompt
that starts with such a row's tokens reuses the states of the common prefix and encodes only
the rest. vLLM does this itself (automatic prefix caching).

Rows are kept without their padding. A row's states are exact for its tokens whatever
padding they are later placed behind: a token's position id counts the real tokens before
it (attention_mask.cumsum), never the padding, so a prefix is put back right-aligned behind
zero-masked slots and the new tokens follow it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


@dataclass(frozen=True)
class KeptRow:
    """One row's real tokens and, per layer, their key and value states [heads, tokens, dim]."""

    ids: list[int]
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass(frozen=True)
class PrefixBatch:
    """A batch whose first `cached` columns are covered by `cache` (None: nothing reused)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    cache: DynamicCache | None
    reused_tokens: int


def reusable(cache) -> bool:
    """Only plain full-attention dynamic caches can be cut into rows and put back together."""
    layers = getattr(cache, "layers", ())
    return type(cache) is DynamicCache and all(type(layer) is DynamicLayer for layer in layers)


class PrefixStore:
    """The rows of one generate call, kept (up to `budget_bytes`) for a later call."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.rows: list[KeptRow] = []
        self._ids = np.zeros((0, 0), dtype=np.int64)
        self._used = 0

    @classmethod
    def union(cls, stores: Iterable[PrefixStore]) -> PrefixStore:
        """One store to look prefixes up in, holding the rows of all of `stores` (shared)."""
        union = cls(0)
        union.rows = [row for store in stores for row in store.rows]
        union._ids = _id_matrix([row.ids for row in union.rows])
        return union

    def keep(self, sequences: torch.Tensor, attention_mask: torch.Tensor, cache) -> None:
        """Keep each row of a finished batch: `sequences` and `attention_mask` cover the
        prompt and the generated tokens; the cache holds states for all but the last token."""
        if not reusable(cache):
            return
        length = cache.get_seq_length()
        for row in range(sequences.shape[0]):
            real = attention_mask[row, :length].nonzero().squeeze(1)
            kept = KeptRow(
                ids=sequences[row, real].tolist(),
                keys=tuple(layer.keys[row].index_select(1, real) for layer in cache.layers),
                values=tuple(layer.values[row].index_select(1, real) for layer in cache.layers),
            )
            if self._used + kept.nbytes > self.budget_bytes:
                break
            self._used += kept.nbytes
            self.rows.append(kept)
        self._ids = _id_matrix([row.ids for row in self.rows])

    def longest_prefix(self, ids: list[int]) -> tuple[int, int]:
        """(row, tokens) of the kept row sharing the longest prefix with `ids`; at least one
        token of `ids` is left to encode, so the model has a position to predict from."""
        if not self.rows or len(ids) < 2:
            return -1, 0
        width = min(self._ids.shape[1], len(ids) - 1)
        same = self._ids[:, :width] == np.asarray(ids[:width])
        common = np.where(same.all(axis=1), width, same.argmin(axis=1))
        row = int(common.argmax())
        return row, int(common[row])

    def batch(self, prompts: list[list[int]], pad_id: int) -> PrefixBatch:
        """Left-padded inputs for `prompts`, reusing each one's longest kept prefix."""
        matches = [self.longest_prefix(ids) for ids in prompts]
        cached = max(tokens for _, tokens in matches)
        rest = max(len(ids) - tokens for ids, (_, tokens) in zip(prompts, matches, strict=True))
        input_ids = torch.full((len(prompts), cached + rest), pad_id, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for i, (ids, (_, tokens)) in enumerate(zip(prompts, matches, strict=True)):
            input_ids[i, cached - tokens : cached] = torch.tensor(ids[:tokens], dtype=torch.long)
            mask[i, cached - tokens : cached] = 1
            tail = ids[tokens:]
            input_ids[i, cached + rest - len(tail) :] = torch.tensor(tail, dtype=torch.long)
            mask[i, cached + rest - len(tail) :] = 1
        cache = self._cache(matches, cached) if cached else None
        reused = sum(tokens for _, tokens in matches)
        return PrefixBatch(input_ids, mask, cache, reused)

    def _cache(self, matches: list[tuple[int, int]], cached: int) -> DynamicCache:
        first = self.rows[next(row for row, tokens in matches if tokens)]
        layers = []
        for layer in range(len(first.keys)):
            heads, _, dim = first.keys[layer].shape
            shape = (len(matches), heads, cached, dim)
            keys = first.keys[layer].new_zeros(shape)
            values = first.values[layer].new_zeros(shape)
            for i, (row, tokens) in enumerate(matches):
                if tokens:
                    keys[i, :, cached - tokens :] = self.rows[row].keys[layer][:, :tokens]
                    values[i, :, cached - tokens :] = self.rows[row].values[layer][:, :tokens]
            layers.append((keys, values))
        return DynamicCache(ddp_cache_data=layers)


def _id_matrix(rows: list[list[int]]) -> np.ndarray:
    """Rows of token ids padded with -1 (never a token id) into one matrix."""
    width = max((len(ids) for ids in rows), default=0)
    matrix = np.full((len(rows), width), -1, dtype=np.int64)
    for i, ids in enumerate(rows):
        matrix[i, : len(ids)] = ids
    return matrix
