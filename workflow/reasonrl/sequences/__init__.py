"""Masked sequences and their log-probabilities under a causal LM (logps), and where two
trajectories of one prompt first part ways (divergence)."""

from reasonrl.sequences.logps import (
    MaskedSequence,
    action_logps,
    encode_step,
    encode_step_pair,
    encode_trajectory,
    next_token_logps,
    pad_sequences,
    pad_with_action_logps,
    predicting_logits,
    predicting_positions,
    sampled_trajectory,
    sequence_logps,
    summed_logps,
    token_logps,
)

__all__ = [
    "MaskedSequence",
    "action_logps",
    "encode_step",
    "encode_step_pair",
    "encode_trajectory",
    "next_token_logps",
    "pad_sequences",
    "pad_with_action_logps",
    "predicting_logits",
    "predicting_positions",
    "sampled_trajectory",
    "sequence_logps",
    "summed_logps",
    "token_logps",
]
