"""Step-level preference pairs (variant credit: step): where chosen and rejected first diverge,
and a loss that scores only that step in the shared context (Step-DPO)."""

from __future__ import annotations

import copy

import pytest
import torch

from reasonrl.errors import ReasonRLError
from reasonrl.models import load_policy
from reasonrl.sequences import encode_step_pair, pad_sequences, sequence_logps
from reasonrl.sequences.divergence import Divergence, diverging_lines, first_divergence
from reasonrl.training.preference import pair_sequences

QUESTION = {"role": "user", "content": "Ben has 80 cards. He sells 77 cards. How many now?"}
PREAMBLE = "Let me compute.\n```python\n# Ben has 80 cards.\nx = 80\n"


def code_turn(sold: int, tail: str = "") -> dict:
    body = f"{PREAMBLE}# He sells {sold} cards.\nx = x - {sold}\n{tail}print(x)\n```"
    return {"role": "assistant", "content": body}


def trajectory(sold: int, tail: str = "") -> list[dict]:
    answer = 80 - sold
    return [
        QUESTION,
        code_turn(sold, tail),
        {"role": "user", "content": f"```output\n{answer}\n```"},
        {"role": "assistant", "content": f"The answer is \\boxed{{{answer}}}."},
    ]


@pytest.fixture(scope="module")
def policy(tiny_policy):
    return load_policy(tiny_policy)


def test_divergence_is_the_first_differing_line_of_the_first_differing_turn():
    chosen, rejected = trajectory(77), trajectory(7)
    divergence = first_divergence(chosen, rejected)
    assert divergence.turn == 1
    lo, hi = divergence.chosen
    assert chosen[1]["content"][lo:hi] == "# He sells 77 cards.\n"
    lo, hi = divergence.rejected
    assert rejected[1]["content"][lo:hi] == "# He sells 7 cards.\n"


def test_a_turn_that_ended_where_the_other_went_on_has_an_empty_step_at_its_end():
    short, long = "a\nb", "a\nb\nc\nd"
    (lo_s, hi_s), (lo_l, hi_l) = diverging_lines(short, long)
    # "b" ends the short turn (its end marker goes with it); "b\n" goes on in the long one
    assert (short[lo_s:hi_s], long[lo_l:hi_l]) == ("b", "b\n")
    assert diverging_lines("a\n", "a\nc\nd") == ((2, 2), (2, 4))


def test_no_divergence_inside_a_model_turn_gives_none():
    same = trajectory(77)
    assert first_divergence(same, copy.deepcopy(same)) is None
    other_output = copy.deepcopy(same)
    other_output[2]["content"] = "```output\nTimeout\n```"
    assert first_divergence(same, other_output) is None
    assert Divergence(1, (0, 1), (0, 1)).turn == 1


def test_step_masks_cover_only_the_diverging_line_in_a_shared_context(policy):
    _, tokenizer = policy
    chosen, rejected = encode_step_pair(tokenizer, trajectory(77), trajectory(7), 1024)
    for seq, line in ((chosen, "# He sells 77 cards."), (rejected, "# He sells 7 cards.")):
        scored = [t for t, m in zip(seq.input_ids, seq.mask, strict=True) if m]
        assert tokenizer.decode(scored).strip() == line
    first = chosen.mask.index(1)
    assert rejected.mask.index(1) == first
    assert chosen.input_ids[:first] == rejected.input_ids[:first]


def test_a_last_line_step_takes_the_turns_end_marker(policy):
    _, tokenizer = policy
    chosen, rejected = trajectory(77), trajectory(77)
    rejected[3] = {"role": "assistant", "content": "The answer is \\boxed{4}."}
    seqs = encode_step_pair(tokenizer, chosen, rejected, 1024)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for seq in seqs:
        scored = [t for t, m in zip(seq.input_ids, seq.mask, strict=True) if m]
        assert scored[-1] == eos


def step_logps(model, tokenizer, chosen: list[dict], rejected: list[dict]) -> torch.Tensor:
    pair = encode_step_pair(tokenizer, chosen, rejected, 1024)
    with torch.no_grad():
        return sequence_logps(model, pad_sequences(list(pair), tokenizer.pad_token_id))[0]


def test_what_follows_the_step_does_not_enter_the_pair(policy):
    model, tokenizer = policy
    base = step_logps(model, tokenizer, trajectory(77), trajectory(7))
    other_tail = step_logps(model, tokenizer, trajectory(77), trajectory(7, "x = x + 1\n"))
    assert torch.allclose(base, other_tail)
    whole = pair_sequences(tokenizer, [pair_row(77, 7)], True, 1024)[0]
    whole_other = pair_sequences(tokenizer, [pair_row(77, 7, "x = x + 1\n")], True, 1024)[0]
    assert whole[1].input_ids != whole_other[1].input_ids  # the trajectory credit sees it


def pair_row(good: int, bad: int, tail: str = "") -> dict:
    return {"chosen": trajectory(good), "rejected": trajectory(bad, tail)}


def test_pair_credit_step_scores_fewer_tokens_and_falls_back_outside_model_turns(policy):
    _, tokenizer = policy
    rows = [pair_row(77, 7)]
    ((step_c, step_r),) = pair_sequences(tokenizer, rows, True, 1024, credit="step")
    ((traj_c, traj_r),) = pair_sequences(tokenizer, rows, True, 1024, credit="trajectory")
    assert 0 < sum(step_c.mask) < sum(traj_c.mask)
    assert 0 < sum(step_r.mask) < sum(traj_r.mask)
    tool_only = {"chosen": trajectory(77), "rejected": copy.deepcopy(trajectory(77))}
    tool_only["rejected"][2]["content"] = "```output\nTimeout\n```"
    ((c, r),) = pair_sequences(tokenizer, [tool_only], True, 1024, credit="step")
    assert sum(c.mask) == sum(traj_c.mask)
    with pytest.raises(ReasonRLError, match="pair credit"):
        pair_sequences(tokenizer, rows, True, 1024, credit="token")


def test_a_step_beyond_max_length_is_an_error_naming_it(policy):
    _, tokenizer = policy
    with pytest.raises(ReasonRLError, match="max_length 8"):
        encode_step_pair(tokenizer, trajectory(77), trajectory(7), 8)


def test_the_variants_credit_reaches_the_cached_reference(policy, tiny_policy, tmp_path):
    from reasonrl.config import validate_config
    from reasonrl.io import read_jsonl, write_jsonl
    from reasonrl.stages.preference import reference_logps

    model, tokenizer = policy
    row = {"problem_id": "p0", "task": "arith", "prompt": [QUESTION], **pair_row(77, 7)}
    write_jsonl(tmp_path / "labels/pairs.jsonl", [row], schema="preference_pair")
    variants = [{"name": "step", "credit": "step"}, {"name": "whole"}]
    config = validate_config({"preference": {"variants": variants}})
    cached = {}
    for name in ("step", "whole"):
        out = tmp_path / f"ref-{name}.jsonl"
        reference_logps(config, name, str(tiny_policy), str(tmp_path / "labels"), str(out))
        cached[name] = read_jsonl(out)[0]["logps"]
    expected = step_logps(model, tokenizer, row["chosen"], row["rejected"]).tolist()
    assert cached["step"] == pytest.approx(expected, abs=1e-4)
    assert cached["whole"][1] < cached["step"][1]  # the whole trajectory has more tokens
