"""The masked next-token loss: SFT, RAFT and the ORM/PRM label answers all train with it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from reasonrl.training.data import IGNORE

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids")


def masked_lm_loss(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy over tokens whose label is not IGNORE (assistant tokens)."""
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    logits = model(**inputs, use_cache=False).logits[:, :-1]
    targets = batch["labels"][:, 1:]
    loss = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=IGNORE
    )
    scored = targets != IGNORE
    # ORM/PRM train only on their label tokens: this is the label (PRM: step) accuracy.
    right = (logits.argmax(-1) == targets) & scored
    stats = {
        "tokens": float(batch["num_tokens"].sum()),
        "target_tokens": float(scored.sum()),
        "token_accuracy": float(right.sum() / scored.sum().clamp(min=1)),
    }
    return loss, stats
