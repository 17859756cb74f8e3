"""Token and sequence log-probabilities of masked sequences under a causal LM.

Below both the losses (training/) and the generation engines: DPO/KTO sum log-probs over a
trajectory's model turns, PPO needs them per token, and the engines report the behaviour
policy's log-probs of what they sampled. A sequence's mask selects the tokens that count
(the model's own turns, from the chat-template spans in reasonrl.chat).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from reasonrl.chat import assistant_spans, render, tokenize_chat
from reasonrl.errors import ReasonRLError
from reasonrl.models import end_of_turn_ids, on_model_device
from reasonrl.sequences.divergence import Divergence, first_divergence


@dataclass(frozen=True)
class MaskedSequence:
    """Token ids of a whole trajectory and the mask of tokens its log-prob sums over."""

    input_ids: list[int]
    mask: list[int]


def encode_trajectory(
    tokenizer, messages: list[dict], multi_turn: bool, max_length: int | None = None
) -> MaskedSequence:
    """Tokenise a trajectory with the mask of the model's turns (multi-turn) or of everything
    after the prompt (single-turn: from the first to the last token of the model's turns)."""
    chat = tokenize_chat(tokenizer, messages, max_length)
    mask = list(chat.loss_mask)
    if not any(mask):
        raise ReasonRLError("trajectory has no model turn to score")
    if not multi_turn:
        first = mask.index(1)
        last = len(mask) - 1 - mask[::-1].index(1)
        mask = [int(first <= i <= last) for i in range(len(mask))]
    return MaskedSequence(chat.input_ids, mask)


def encode_step(
    tokenizer, messages: list[dict], turn: int, span: tuple[int, int], max_length: int | None
) -> MaskedSequence:
    """Tokenise a trajectory with the mask of one step of its model turn `turn`: every token
    that overlaps the step's characters (`span` of the turn's content; a span that reaches the
    content's end takes the turn's end marker). Overlap, not start, decides, so a token that
    straddles the step's first character is scored on both sides of a pair."""
    text, spans = assistant_spans(tokenizer, messages)
    start, end = spans[sum(m["role"] == "assistant" for m in messages[:turn])]
    content = messages[turn]["content"]
    if text[start : start + len(content)] != content:
        raise ReasonRLError("the chat template rewrites a model turn; its steps cannot be located")
    lo = start + span[0]
    hi = end if span[1] == len(content) else start + span[1]
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"][:max_length]
    mask = [int(a < hi and b > lo) for a, b in encoded["offset_mapping"]][:max_length]
    if not any(mask):
        raise ReasonRLError(f"a step-level pair's step lies beyond max_length {max_length}")
    return MaskedSequence(ids, mask)


def encode_step_pair(
    tokenizer, chosen: list[dict], rejected: list[dict], max_length: int | None
) -> tuple[MaskedSequence, MaskedSequence] | None:
    """(chosen, rejected) masked on the step where they first diverge (sequences.divergence),
    or None when they first differ outside a model turn."""
    divergence: Divergence | None = first_divergence(chosen, rejected)
    if divergence is None:
        return None
    return (
        encode_step(tokenizer, chosen, divergence.turn, divergence.chosen, max_length),
        encode_step(tokenizer, rejected, divergence.turn, divergence.rejected, max_length),
    )


def sampled_trajectory(
    tokenizer,
    messages: list[dict],
    turn_token_ids: list[list[int]],
    max_length: int | None = None,
) -> MaskedSequence:
    """A sampled trajectory as the policy sampled it: each model turn's sampled token ids
    (mask 1) after the template text the tool loop put before it (mask 0).

    Re-rendering the messages (encode_trajectory) scores other tokens than the sampled ones:
    the text is a lossy decoding (sampled special tokens dropped, stray bytes become U+FFFD
    and three tokens, neighbours re-merged by BPE), and a turn cut by a token cap, or at the
    tool loop's stop string, gets an end-of-turn token the model never wrote. Log-ratios on
    such tokens are no KL estimate: measured -3.2 nats per sample after 6 online DPO steps,
    against +0.01 on the sampled ids. Here a capped turn ends at its last sampled token.

    The first turn's context is the generator's prompt, token for token. A later turn is
    scored after the earlier turns' sampled ids, where the generator saw their re-encoded
    text (the same tokens whenever the text round-trips). `turn_token_ids` come from
    run_rollouts (a continued rollout's given turns have none).
    """
    turns = [i for i, message in enumerate(messages) if message["role"] == "assistant"]
    if not turns or len(turns) != len(turn_token_ids):
        raise ReasonRLError(
            f"trajectory has {len(turns)} model turns but sampled ids for {len(turn_token_ids)}"
        )
    end_of_turn = set(end_of_turn_ids(tokenizer))
    ids: list[int] = []
    mask: list[int] = []
    covered, previous_end = "", None
    for index, sampled in zip(turns, turn_token_ids, strict=True):
        context = render(tokenizer, messages[:index], add_generation_prompt=True)
        if not context.startswith(covered):
            raise ReasonRLError("the tokenizer's chat template is not prefix-consistent")
        glue = tokenizer(context[len(covered) :], add_special_tokens=False)["input_ids"]
        if glue[:1] == [previous_end]:
            glue = glue[1:]  # the template's end-of-turn marker, which the turn already sampled
        ids += glue + list(sampled)
        mask += [0] * len(glue) + [1] * len(sampled)
        covered = context + messages[index]["content"]
        previous_end = sampled[-1] if sampled and sampled[-1] in end_of_turn else None
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return MaskedSequence(ids, mask)


def pad_sequences(seqs: Sequence[MaskedSequence], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded input_ids, attention_mask and score mask of a list of sequences."""
    width = max(len(s.input_ids) for s in seqs)
    rows = [(s, width - len(s.input_ids)) for s in seqs]
    return {
        "input_ids": torch.tensor([s.input_ids + [pad_id] * fill for s, fill in rows]),
        "attention_mask": torch.tensor([[1] * (width - fill) + [0] * fill for _, fill in rows]),
        "score_mask": torch.tensor([s.mask + [0] * fill for s, fill in rows]),
    }


def action_logps(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log pi(token j+1 | prefix up to j), shape [B, T-1]."""
    logps = logits[:, :-1].float().log_softmax(-1)
    return torch.gather(logps, 2, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def next_token_logps(
    model: torch.nn.Module, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.dtype]:
    """log pi(token j+1 | prefix up to j) of every row [B, T-1] (fp32), and the logits' dtype."""
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).logits
    return action_logps(logits, batch["input_ids"]), logits.dtype


def predicting_positions(targets: torch.Tensor) -> torch.Tensor:
    """The positions (ascending) whose logits predict a target in some row: j when token
    j+1 of any row is one (`targets` [B, T] marks the target tokens).

    Given to a model as transformers' `logits_to_keep`, it makes logits only there: the
    vocabulary projection (and its softmax) at positions whose logits are thrown away costs
    as much as at the others, forward and backward.
    """
    return targets[:, 1:].bool().any(0).nonzero().flatten()


def predicting_logits(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's logits only at the positions that predict a target of some row
    (predicting_positions of `targets` [B, T]), and those positions."""
    kept = predicting_positions(targets)
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        use_cache=False,
        logits_to_keep=kept,
    ).logits
    return logits, kept


def pad_with_action_logps(
    seqs: Sequence[MaskedSequence], per_token: dict[str, list[list[float]]], pad_id: int
) -> dict[str, torch.Tensor]:
    """pad_sequences' rows with the shifted action mask [B, T-1] (the scored tokens after the
    first position: the model's own) and, for each name of `per_token`, its values (one
    list per sequence, one value per action, e.g. a policy's log-probs) placed on the
    actions, 0 elsewhere."""
    batch = pad_sequences(seqs, pad_id)
    action = batch["score_mask"][:, 1:].bool()
    for name, rows in per_token.items():
        values = torch.zeros(action.shape)
        for i, row in enumerate(rows):
            values[i, action[i]] = torch.tensor(row, dtype=torch.float32)
        batch[name] = values
    batch["action_mask"] = action.long()
    return batch


def sequence_logps(
    model: torch.nn.Module, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of log pi(token | prefix) over the score mask of each row, and the token counts.

    Logits are made only at the positions that predict a scored token (predicting_logits).
    """
    logits, kept = predicting_logits(model, batch, batch["score_mask"])
    scored = batch["score_mask"][:, 1:][:, kept].bool()
    targets = batch["input_ids"][:, 1:][:, kept][scored]
    picked = logits[scored].float().log_softmax(-1).gather(1, targets.unsqueeze(-1)).squeeze(-1)
    logps = torch.zeros(scored.shape, dtype=picked.dtype, device=picked.device)
    logps = logps.masked_scatter(scored, picked)
    return logps.sum(-1), scored.to(logits.dtype).sum(-1)


@torch.no_grad()
@torch.inference_mode()
def token_logps(
    model: torch.nn.Module, seqs: list[MaskedSequence], pad_id: int, batch_size: int = 16
) -> list[list[float]]:
    """log pi(token | prefix) of each scored token (mask 1, after the first position) of each
    sequence, in order: per-token log-probs for PPO's ratio and KL penalty."""
    model.eval()
    values: list[list[float]] = []
    for start in range(0, len(seqs), batch_size):
        batch = on_model_device(pad_sequences(seqs[start : start + batch_size], pad_id), model)
        logps, _ = next_token_logps(model, batch)
        mask = batch["score_mask"][:, 1:].bool()
        values.extend(row[keep].tolist() for row, keep in zip(logps, mask, strict=True))
    return values


def summed_logps(
    model: torch.nn.Module, seqs: list[MaskedSequence], pad_id: int, batch_size: int = 16
) -> list[float]:
    """Summed log-probs of each sequence under `model` (eval mode, no gradients): the
    reference's cached values for preference training, or the behaviour policy's."""
    from tqdm import tqdm

    model.eval()
    values: list[float] = []
    for start in tqdm(range(0, len(seqs), batch_size), desc="reference", leave=False):
        batch = on_model_device(pad_sequences(seqs[start : start + batch_size], pad_id), model)
        values.extend(sequence_logps(model, batch)[0].tolist())
    return values
