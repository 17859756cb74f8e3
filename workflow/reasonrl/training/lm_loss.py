"""The masked next-token loss: SFT, RAFT and the ORM/PRM label answers all train with it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from reasonrl.sequences import predicting_positions
from reasonrl.training.data import IGNORE, PACKED_INPUTS

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids")


def masked_lm_loss(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy over tokens whose label is not IGNORE (assistant tokens).

    Logits are made only at the positions that predict a label (predicting_positions).
    """
    inputs = {k: batch[k] for k in MODEL_INPUTS + PACKED_INPUTS if k in batch}
    kept = predicting_positions(batch["labels"] != IGNORE)
    logits = model(**inputs, use_cache=False, logits_to_keep=kept).logits
    labels = batch["labels"][:, 1:][:, kept]
    scored = labels != IGNORE
    targets = labels[scored]
    logits = logits[scored]
    loss = F.cross_entropy(logits.float(), targets)
    # ORM/PRM train only on their label tokens: this is the label (PRM: step) accuracy.
    right = logits.argmax(-1) == targets
    stats = {
        "tokens": float(batch["num_tokens"].sum()),
        "target_tokens": float(targets.numel()),
        "token_accuracy": float(right.sum() / max(1, targets.numel())),
    }
    return loss, stats


def target_tokens(batch: dict) -> float:
    """What masked_lm_loss is a mean over: the tokens with a label (the loop's LossUnits)."""
    return float((batch["labels"][:, 1:] != IGNORE).sum())
