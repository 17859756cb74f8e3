"""Sequence rewards of sampled trajectories, shared by PPO and online DPO / Proximal RLOO.

oracle: the verifier (1 when the answer or unit tests check out, else 0); rm: the scalar of a
Bradley-Terry reward model; combined: sigmoid(0.5 * rm) + oracle - 1, as Qwen-Math combines
them (the PF-PPO paper's appendix B).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from reasonrl.chat import render
from reasonrl.errors import ReasonRLError
from reasonrl.models import on_model_device
from reasonrl.rewards.models import load_reward_model
from reasonrl.rewards.scoring import BT_BATCH, bt_scores

REWARDS = ("rm", "oracle", "combined")


class SequenceScorer:
    """Scores rows (with "messages" and "correct"); `key` names the config key in errors."""

    def __init__(self, kind: str, reward_model: str | None, dtype: str, key: str):
        self.check(kind, reward_model, key)
        self.kind = kind
        self.model = self.tokenizer = None
        self.sharded = False  # over the job's processes (shard)
        if kind != "oracle":
            self.model, self.tokenizer, info = load_reward_model(reward_model, dtype)
            if info["kind"] != "bt":
                raise ReasonRLError(
                    f"{reward_model}: {key} takes a Bradley-Terry RM, not '{info['kind']}'"
                )

    @staticmethod
    def check(kind: str, reward_model: str | None, key: str) -> None:
        """Raise the one-line error for an unknown kind or a missing reward model."""
        if kind not in REWARDS:
            raise ReasonRLError(f"unknown {key} {kind!r} (expected one of {REWARDS})")
        if kind != "oracle" and not reward_model:
            raise ReasonRLError(f"{key} {kind!r} needs a reward model (--reward-model)")

    def shard(self, shard: Callable[[torch.nn.Module], torch.nn.Module]) -> None:
        """Hold the reward model as `shard(model)` (training.zero3.frozen_shards); nothing for
        the verifier, which has none."""
        if self.model is not None:
            self.model, self.sharded = shard(self.model), True

    def forwards(self, rows: int) -> int:
        """The reward model's forward passes that scoring `rows` rows runs."""
        return 0 if self.model is None else math.ceil(rows / BT_BATCH)

    @torch.inference_mode()
    def idle_forwards(self, count: int) -> None:
        """`count` reward-model forwards on a one-token row, their results dropped, where the
        model is sharded: what a process with fewer rows runs so that the model's layers
        gather with the other processes' (ZeRO-3)."""
        if not self.sharded:
            return
        row = torch.tensor([[self.tokenizer.pad_token_id]])
        batch = {"input_ids": row, "attention_mask": torch.ones_like(row)}
        batch = on_model_device(batch, self.model)
        for _ in range(count):
            self.model(**batch, use_cache=False)

    def in_step(self, rows: list[dict], most_rows: int) -> tuple[list[float], int]:
        """`rows` scored (self(rows)), then idle forwards up to the forwards of scoring
        `most_rows` rows: what each process runs where another may score more (ZeRO-3)."""
        scored = self(rows)
        self.idle_forwards(self.forwards(most_rows) - self.forwards(len(rows)))
        return scored

    def rm(self, rows: list[dict]) -> list[float]:
        texts = [render(self.tokenizer, r["messages"]) for r in rows]
        return bt_scores(self.model, self.tokenizer, texts, batch_size=BT_BATCH)  # forwards()

    def __call__(self, rows: list[dict]) -> tuple[list[float], int]:
        """(scores, reward-model passes)."""
        oracle = [float(r["correct"]) for r in rows]
        if self.kind == "oracle":
            return oracle, 0
        rm = self.rm(rows)
        if self.kind == "rm":
            return rm, len(rows)
        combined = [1 / (1 + math.exp(-0.5 * s)) + o - 1 for s, o in zip(rm, oracle, strict=True)]
        return combined, len(rows)
