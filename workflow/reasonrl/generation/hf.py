"""Hugging Face `generate` engine: batched, left padding, KV cache, stop strings, seeds."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from reasonrl.generation.engine import Completion, SamplingParams
from reasonrl.generation.prefix_cache import PrefixStore
from reasonrl.models import end_of_turn_ids, load_policy, on_model_device

if TYPE_CHECKING:
    from reasonrl.sequences import MaskedSequence


def _cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    cuts = [text.index(s) for s in stops if s in text]
    return (text[: min(cuts)], True) if cuts else (text, False)


class HFEngine:
    def __init__(self, model, tokenizer, batch_size: int = 32, prefix_cache_mb: int = 1024):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        self.batch_size = batch_size
        self.eos_ids = end_of_turn_ids(tokenizer)
        self.prefix_cache_bytes = prefix_cache_mb * 2**20
        # Inside a conversation: the rows of its last calls (as many as it continues).
        self._previous: deque[PrefixStore] | None = None
        self.reused_tokens = 0  # prompt tokens taken from kept states instead of encoded

    @classmethod
    def from_pretrained(
        cls, path: str, batch_size: int = 32, dtype: str = "float32", prefix_cache_mb: int = 1024
    ) -> HFEngine:
        model, tokenizer = load_policy(path, dtype)
        return cls(model, tokenizer, batch_size, prefix_cache_mb)

    @contextmanager
    def conversation(self, calls: int = 1) -> Iterator[None]:
        """Calls inside continue earlier ones (same weights, prompts that extend the prompts
        and completions of one of the last `calls` calls): each call keeps its rows'
        key/value states, up to generation.prefix_cache_mb over those calls, and a later
        call encodes only what is new."""
        self._previous = deque(maxlen=calls)
        try:
            yield
        finally:
            self._previous = None

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Replace the model's weights in place (the running engine keeps its tokenizer)."""
        self.model.load_state_dict(state_dict)
        if self._previous is not None:
            self._previous.clear()  # states of the old weights are not reused

    def sequence_logps(self, seqs: list[MaskedSequence]) -> list[float]:
        """Summed log-probs of each sequence's masked tokens under the current weights."""
        from reasonrl.sequences import summed_logps

        return summed_logps(self.model, seqs, self.tokenizer.pad_token_id)

    def token_logps(self, seqs: list[MaskedSequence]) -> list[list[float]]:
        """Log-prob of each masked token (after the first position) under the current weights."""
        from reasonrl.sequences import token_logps

        return token_logps(self.model, seqs, self.tokenizer.pad_token_id)

    def generate(self, prompts: list[str], params: SamplingParams) -> list[Completion]:
        # Longest prompts first so each batch pads little; results go back in prompt order.
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        results: list[Completion | None] = [None] * len(prompts)
        previous = self._previous
        store = PrefixStore.union(previous or ())
        kept = None
        if previous is not None:
            kept = PrefixStore(self.prefix_cache_bytes // previous.maxlen)
        starts = range(0, len(order), self.batch_size)
        for batch_no, start in enumerate(tqdm(starts, desc="generate", leave=False)):
            idx = order[start : start + self.batch_size]
            batch = self._generate_batch([prompts[i] for i in idx], params, batch_no, store, kept)
            for i, completion in zip(idx, batch, strict=True):
                results[i] = completion
        if kept is not None:
            previous.append(kept)
        return results

    @torch.inference_mode()
    def _generate_batch(
        self,
        prompts: list[str],
        params: SamplingParams,
        batch_no: int,
        store: PrefixStore,
        kept: PrefixStore | None,
    ) -> list[Completion]:
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        inputs = store.batch(ids, self.tokenizer.pad_token_id)
        self.reused_tokens += inputs.reused_tokens
        enc = on_model_device(
            {"input_ids": inputs.input_ids, "attention_mask": inputs.attention_mask}, self.model
        )
        torch.manual_seed(params.seed + batch_no)
        sampling = params.temperature > 0
        out = self.model.generate(
            **enc,
            past_key_values=inputs.cache,
            return_dict_in_generate=True,
            do_sample=sampling,
            temperature=params.temperature if sampling else None,
            top_p=params.top_p if sampling else None,
            top_k=None,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            stop_strings=list(params.stop) or None,
            tokenizer=self.tokenizer if params.stop else None,
            use_cache=True,
            # Each process samples alone: transformers would otherwise step in lockstep with
            # every process of a DeepSpeed ZeRO-3 job (an all-reduce per token), and PPO's
            # processes sample different prompts with the policy gathered whole
            # (training.zero3.for_generation), one of them possibly none.
            synced_gpus=False,
        )
        sequences, prompt_width = out.sequences, enc["input_ids"].shape[1]
        if kept is not None:
            # generate attends to every token it appends, padding after a row's end included
            generated = torch.ones_like(sequences[:, prompt_width:])
            mask = torch.cat([enc["attention_mask"], generated], 1)
            kept.keep(sequences, mask, out.past_key_values)
        new_tokens = sequences[:, prompt_width:]
        return [self._completion(row.tolist(), params) for row in new_tokens]

    def _completion(self, ids: list[int], params: SamplingParams) -> Completion:
        end = next((j for j, t in enumerate(ids) if t in self.eos_ids), None)
        if end is not None:
            text = self.tokenizer.decode(ids[:end], skip_special_tokens=True)
            n, reason = end + 1, "eos"
        else:
            # Rows stopped by a stop string are padded up to the longest row of the batch.
            n = len(ids)
            while n and ids[n - 1] == self.tokenizer.pad_token_id:
                n -= 1
            text = self.tokenizer.decode(ids[:n], skip_special_tokens=True)
            reason = "length" if n >= params.max_new_tokens else "eos"
        text, stopped = _cut_at_stop(text, params.stop)
        return Completion(
            text=text,
            num_tokens=n,
            finish_reason="stop" if stopped else reason,
            token_ids=tuple(ids[:n]),
        )
