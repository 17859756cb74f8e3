"""M-DPO / M-KTO and their baselines: against TRL, against the formulas, masks token by token."""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from reasonrl.chat import assistant_spans, render
from reasonrl.models import load_policy
from reasonrl.sequences import encode_trajectory, pad_sequences, sequence_logps, summed_logps
from reasonrl.training.preference import (
    LossSettings,
    PreferenceBatches,
    PreferenceObjective,
    kto_loss,
)

QUESTION = {"role": "user", "content": "Tom has 12 pens. He buys 30 more. How many pens?"}
CODE = {"role": "assistant", "content": "Let me compute.\n```python\nx = 12 + 30\nprint(x)\n```"}
OUTPUT = {"role": "user", "content": "```output\n42\n```"}
ANSWER = {"role": "assistant", "content": "The answer is \\boxed{42}."}
WRONG = {"role": "assistant", "content": "The answer is \\boxed{41}."}
TOOL_TRAJECTORY = [QUESTION, CODE, OUTPUT, ANSWER]


@pytest.fixture(scope="module")
def policy(tiny_policy):
    model, tokenizer = load_policy(tiny_policy)
    return model, tokenizer


@pytest.fixture(scope="module")
def reference(policy):
    """The policy with perturbed weights, so log-ratios are not all zero."""
    model = copy.deepcopy(policy[0])
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def per_token_logps(model, ids: list[int]) -> list[float]:
    """log pi(ids[t] | ids[:t]) for t >= 1, one unpadded sequence at a time."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def span_flags(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids and 1/0 per token: inside an assistant turn's character span (independent of
    the loss module's masks)."""
    text, spans = assistant_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    flags = [int(any(lo <= s < hi for lo, hi in spans)) for s, _ in enc["offset_mapping"]]
    return enc["input_ids"], flags


# ---- masks ---------------------------------------------------------------------------------


def test_multi_turn_mask_is_the_model_turns_token_by_token(policy):
    _, tokenizer = policy
    seq = encode_trajectory(tokenizer, TOOL_TRAJECTORY, multi_turn=True)
    ids, flags = span_flags(tokenizer, TOOL_TRAJECTORY)
    assert seq.input_ids == ids
    assert seq.mask == flags
    text = render(tokenizer, TOOL_TRAJECTORY)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    output_at = text.index("```output")
    for (start, _), flag in zip(enc["offset_mapping"], seq.mask, strict=True):
        if output_at <= start < output_at + len(OUTPUT["content"]):
            assert flag == 0, "interpreter output must not count in M-DPO/M-KTO"
        if start < text.index("Let me"):
            assert flag == 0, "prompt tokens must not count"
    scored = tokenizer.decode([t for t, m in zip(seq.input_ids, seq.mask, strict=True) if m])
    assert scored == CODE["content"] + "<|im_end|>" + ANSWER["content"] + "<|im_end|>"


def test_single_turn_mask_counts_interpreter_tokens_but_not_the_prompt(policy):
    _, tokenizer = policy
    multi = encode_trajectory(tokenizer, TOOL_TRAJECTORY, multi_turn=True)
    single = encode_trajectory(tokenizer, TOOL_TRAJECTORY, multi_turn=False)
    first = multi.mask.index(1)
    last = len(multi.mask) - 1 - multi.mask[::-1].index(1)
    assert single.mask == [int(first <= i <= last) for i in range(len(single.mask))]
    scored = tokenizer.decode([t for t, m in zip(single.input_ids, single.mask, strict=True) if m])
    assert OUTPUT["content"] in scored and QUESTION["content"] not in scored
    assert sum(single.mask) > sum(multi.mask)


def test_sequence_logps_sum_exactly_the_masked_tokens(policy):
    model, tokenizer = policy
    seqs = [
        encode_trajectory(tokenizer, TOOL_TRAJECTORY, multi_turn=True),
        encode_trajectory(tokenizer, [QUESTION, WRONG], multi_turn=True),
    ]
    projected = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda _module, args, _out: projected.append(tuple(args[0].shape[:2]))
    )
    got, counts = sequence_logps(model.eval(), pad_sequences(seqs, tokenizer.pad_token_id))
    hook.remove()
    # the vocabulary projection ran only where it predicts a scored token of some row
    predicting = {j for seq in seqs for j, m in enumerate(seq.mask[1:]) if m}
    assert projected == [(len(seqs), len(predicting))]
    for seq, value, count in zip(seqs, got.tolist(), counts.tolist(), strict=True):
        token_logps = per_token_logps(model, seq.input_ids)
        expected = sum(lp for lp, m in zip(token_logps, seq.mask[1:], strict=True) if m)
        assert value == pytest.approx(expected, abs=1e-4)
        assert count == sum(seq.mask[1:])


# ---- M-DPO == TRL's DPO loss when there is no interpreter turn ------------------------------


def trl_dpo_loss(model, batch: dict, completion_mask, ref_chosen, ref_rejected, beta: float):
    """TRL's DPOTrainer._compute_loss (sigmoid loss, precomputed reference log-probs)."""
    from accelerate import Accelerator
    from trl import DPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    trl_model = copy.deepcopy(model)
    add_fused_lm_head(trl_model, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    trainer = SimpleNamespace(
        model=trl_model,
        accelerator=Accelerator(cpu=True),
        aux_loss_enabled=False,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_types=["sigmoid"],
        loss_weights=[1.0],
        beta=beta,
        use_weighting=False,
        label_smoothing=0.0,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
    )
    inputs = {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "completion_mask": completion_mask,
        "ref_chosen_logps": ref_chosen,
        "ref_rejected_logps": ref_rejected,
    }
    return DPOTrainer._compute_loss(trainer, trl_model, inputs, return_outputs=False)


def completion_mask_after_prompt(tokenizer, messages: list[dict], width: int) -> list[int]:
    """TRL's notion of the completion: every token after the rendered prompt (with its
    generation header), up to the end of the reply's end-of-turn marker."""
    text = render(tokenizer, messages)
    prompt = render(tokenizer, messages[:1], add_generation_prompt=True)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    end = len(text.rstrip())
    flags = [int(len(prompt) <= s < end) for s, _ in enc["offset_mapping"]]
    return flags + [0] * (width - len(flags))


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_mdpo_equals_trl_dpo_without_interpreter_turns(policy, reference, beta):
    model, tokenizer = policy
    chosen = [[QUESTION, ANSWER], [QUESTION, {"role": "assistant", "content": "It is 42."}]]
    rejected = [[QUESTION, WRONG], [QUESTION, {"role": "assistant", "content": "Maybe 7?"}]]
    items = [
        (encode_trajectory(tokenizer, c, True), encode_trajectory(tokenizer, r, True))
        for c, r in zip(chosen, rejected, strict=True)
    ]
    flat = [s for pair in items for s in pair]
    ref = summed_logps(reference, flat, tokenizer.pad_token_id)
    cached = [(ref[0], ref[1]), (ref[2], ref[3])]
    batches = PreferenceBatches(items, 2, tokenizer.pad_token_id, seed=0, reference=cached)
    batch = batches(0)
    ours, _ = PreferenceObjective(LossSettings("mdpo", beta=beta))(model.eval(), batch)

    n = batch["input_ids"].shape[0] // 2
    order = [batch["ref_logps"][:n], batch["ref_logps"][n:]]
    conversations = [*chosen, *rejected]
    # the batch's rows in the batch's order: match each row back to its conversation
    rows = []
    for ids in batch["input_ids"].tolist():
        rows.append(
            next(
                c
                for c in conversations
                if ids[: len(s := encode_trajectory(tokenizer, c, True).input_ids)] == s
            )
        )
    width = batch["input_ids"].shape[1]
    completion = torch.tensor([completion_mask_after_prompt(tokenizer, c, width) for c in rows])
    assert torch.equal(completion, batch["score_mask"]), "no interpreter turn: masks agree"
    theirs = trl_dpo_loss(model, batch, completion, order[0], order[1], beta)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-6)
    assert ours.item() != pytest.approx(math.log(2), abs=1e-4), "log-ratios must not be zero"


def test_single_turn_dpo_equals_mdpo_without_interpreter_turns(policy, reference):
    model, tokenizer = policy
    losses = []
    for name in ("mdpo", "dpo"):
        multi = LossSettings(name).multi_turn
        pair = (
            encode_trajectory(tokenizer, [QUESTION, ANSWER], multi),
            encode_trajectory(tokenizer, [QUESTION, WRONG], multi),
        )
        ref = summed_logps(reference, list(pair), tokenizer.pad_token_id)
        batches = PreferenceBatches([pair], 1, tokenizer.pad_token_id, 0, reference=[tuple(ref)])
        losses.append(PreferenceObjective(LossSettings(name))(model.eval(), batches(0))[0].item())
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)


def test_single_turn_dpo_differs_from_mdpo_with_interpreter_turns(policy, reference):
    model, tokenizer = policy
    wrong_tool = [QUESTION, CODE, {"role": "user", "content": "```output\n41\n```"}, WRONG]
    losses = []
    for name in ("mdpo", "dpo"):
        multi = LossSettings(name).multi_turn
        pair = (
            encode_trajectory(tokenizer, TOOL_TRAJECTORY, multi),
            encode_trajectory(tokenizer, wrong_tool, multi),
        )
        ref = summed_logps(reference, list(pair), tokenizer.pad_token_id)
        batches = PreferenceBatches([pair], 1, tokenizer.pad_token_id, 0, reference=[tuple(ref)])
        losses.append(PreferenceObjective(LossSettings(name))(model.eval(), batches(0))[0].item())
    assert losses[0] != pytest.approx(losses[1], abs=1e-5)


# ---- M-KTO against the formula written out here ---------------------------------------------


def kto_by_hand(ratios, desirable, beta, lam_d=1.0, lam_u=1.0) -> float:
    z0 = max(0.0, sum(ratios) / len(ratios))
    sigmoid = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    per_row = [
        lam_d - lam_d * sigmoid(beta * (r - z0)) if d else lam_u - lam_u * sigmoid(beta * (z0 - r))
        for r, d in zip(ratios, desirable, strict=True)
    ]
    return sum(per_row) / len(per_row)


@pytest.mark.parametrize("shift", [-3.0, 4.0])  # z0 clipped at 0, and z0 > 0
def test_kto_loss_matches_the_formula(shift):
    gen = torch.Generator().manual_seed(0)
    policy = torch.randn(6, generator=gen) * 5 + shift
    ref = torch.randn(6, generator=gen) * 5
    desirable = torch.tensor([True, False, True, True, False, False])
    losses, z0 = kto_loss(policy, ref, desirable, 0.1, 1.0, 1.0)
    ratios = (policy - ref).tolist()
    assert float(z0) == pytest.approx(max(0.0, sum(ratios) / 6), abs=1e-6)
    assert float(losses.mean()) == pytest.approx(kto_by_hand(ratios, desirable.tolist(), 0.1))
    weighted, _ = kto_loss(policy, ref, desirable, 0.1, 2.0, 0.5)
    assert float(weighted.mean()) == pytest.approx(
        kto_by_hand(ratios, desirable.tolist(), 0.1, 2.0, 0.5)
    )


def test_mkto_objective_matches_the_formula_on_masked_log_ratios(policy, reference):
    model, tokenizer = policy
    wrong_tool = [QUESTION, CODE, {"role": "user", "content": "```output\n41\n```"}, WRONG]
    conversations = [TOOL_TRAJECTORY, wrong_tool, [QUESTION, ANSWER]]
    desirable = [True, False, True]
    seqs = [encode_trajectory(tokenizer, c, True) for c in conversations]
    ref = summed_logps(reference, seqs, tokenizer.pad_token_id)
    batches = PreferenceBatches(seqs, 3, tokenizer.pad_token_id, 0, desirable, ref)
    batch = batches(0)
    loss, stats = PreferenceObjective(LossSettings("mkto", beta=0.1))(model.eval(), batch)
    ratios = []
    for ids in batch["input_ids"].tolist():
        index = next(i for i, s in enumerate(seqs) if ids[: len(s.input_ids)] == s.input_ids)
        ids_, flags = span_flags(tokenizer, conversations[index])
        lp = sum(x for x, m in zip(per_token_logps(model, ids_), flags[1:], strict=True) if m)
        lr = sum(x for x, m in zip(per_token_logps(reference, ids_), flags[1:], strict=True) if m)
        ratios.append((lp - lr, desirable[index]))
    expected = kto_by_hand([r for r, _ in ratios], [d for _, d in ratios], 0.1)
    assert loss.item() == pytest.approx(expected, abs=1e-5)
    assert stats["kl_z0"] == pytest.approx(max(0.0, sum(r for r, _ in ratios) / 3), abs=1e-5)


# ---- reference handling and the NLL term -----------------------------------------------------


def test_live_reference_gives_the_cached_reference_loss(policy, reference):
    model, tokenizer = policy
    wrong_tool = [QUESTION, CODE, {"role": "user", "content": "```output\n41\n```"}, WRONG]
    pair = (
        encode_trajectory(tokenizer, TOOL_TRAJECTORY, True),
        encode_trajectory(tokenizer, wrong_tool, True),
    )
    ref = summed_logps(reference, list(pair), tokenizer.pad_token_id)
    cached = PreferenceBatches([pair], 1, tokenizer.pad_token_id, 0, reference=[tuple(ref)])
    live = PreferenceBatches([pair], 1, tokenizer.pad_token_id, 0)
    settings = LossSettings("mdpo")
    with_cache = PreferenceObjective(settings)(model.eval(), cached(0))[0]
    with_model = PreferenceObjective(settings, reference_model=reference)(model.eval(), live(0))[0]
    assert with_cache.item() == pytest.approx(with_model.item(), abs=1e-5)
    assert "ref_logps" not in live(0)


def test_nll_term_adds_the_mean_token_nll_of_the_chosen(policy, reference):
    model, tokenizer = policy
    pair = (
        encode_trajectory(tokenizer, [QUESTION, ANSWER], True),
        encode_trajectory(tokenizer, [QUESTION, WRONG], True),
    )
    ref = summed_logps(reference, list(pair), tokenizer.pad_token_id)
    batch = PreferenceBatches([pair], 1, tokenizer.pad_token_id, 0, reference=[tuple(ref)])(0)
    plain = PreferenceObjective(LossSettings("mdpo"))(model.eval(), batch)[0]
    with_nll, stats = PreferenceObjective(LossSettings("mdpo", nll_weight=0.5))(model, batch)
    token_logps = per_token_logps(model, pair[0].input_ids)
    chosen = [lp for lp, m in zip(token_logps, pair[0].mask[1:], strict=True) if m]
    nll = -sum(chosen) / len(chosen)
    assert stats["nll"] == pytest.approx(nll, abs=1e-4)
    assert with_nll.item() == pytest.approx(plain.item() + 0.5 * nll, abs=1e-4)


def test_raft_is_not_a_preference_objective():
    from reasonrl.errors import ReasonRLError

    with pytest.raises(ReasonRLError, match="not a preference loss"):
        PreferenceObjective(LossSettings("raft"))


def test_dpo_logs_chosen_and_rejected_rewards_apart(policy, reference):
    model, tokenizer = policy
    items = [
        (encode_trajectory(tokenizer, [QUESTION, ANSWER], True),
         encode_trajectory(tokenizer, [QUESTION, WRONG], True))
    ]  # fmt: skip
    ref = summed_logps(reference, list(items[0]), tokenizer.pad_token_id)
    batch = PreferenceBatches(items, 1, tokenizer.pad_token_id, 0, reference=[tuple(ref)])(0)
    _, stats = PreferenceObjective(LossSettings("mdpo", beta=0.5))(model.eval(), batch)
    logps = summed_logps(model, list(items[0]), tokenizer.pad_token_id)
    assert stats["reward_chosen"] == pytest.approx(0.5 * (logps[0] - ref[0]), abs=1e-4)
    assert stats["reward_rejected"] == pytest.approx(0.5 * (logps[1] - ref[1]), abs=1e-4)
    margin = stats["reward_chosen"] - stats["reward_rejected"]
    assert stats["reward_margin"] == pytest.approx(margin, abs=1e-5)
