"""One GRPO training step: reasonrl's loss against TRL's GRPOTrainer loss, same model, same batch.

python bench/grpo_step.py [--groups 8] [--samples 8] [--steps 10] [--aggregation dapo]
    [--hidden 256] [--layers 4]

A step is the loss on one batch, its backward and an AdamW step. reasonrl's side is
training/grpo.py as the online learner runs it (`grpo_batch` -> `grpo_loss`: its own
log-probs and entropy over the padded rows); TRL's is `GRPOTrainer._compute_loss` on the
same rows (prompt and completion ids, the tool mask, the same per-token sampling and
reference log-probs, the advantages: tests/trl_grpo.py), its model given TRL's fused LM head.
Both start from the same weights and their first losses must agree (the bench exits 1
otherwise: not the same work). The batch: `groups` prompts of 32 tokens x `samples`
completions of 32 to 256 tokens, each with an interpreter turn of 16 tokens masked out (a
multi-turn tool trajectory), on a randomly initialised Llama of the given shape (the timing
does not depend on the weights). The steps interleave reasonrl, TRL, TRL, reasonrl, so a change
in the machine's load costs both alike; the first step of each is warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from record import append
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from trl_grpo import trl_grpo_loss, trl_inputs, trl_model, trl_trainer  # noqa: E402

from reasonrl.sequences import MaskedSequence  # noqa: E402
from reasonrl.training.grpo import GRPOSettings, grpo_batch, grpo_loss  # noqa: E402

PROMPT_TOKENS, TOOL_TOKENS, VOCAB = 32, 16, 2048


def completions(count: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(ids, tool mask) of `count` completions of 32 to 256 tokens, the middle 16 of each an
    interpreter turn (mask 0)."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        length = int(torch.randint(32, 257, (1,), generator=generator))
        ids = torch.randint(3, VOCAB, (length,), generator=generator).tolist()
        start = (length - TOOL_TOKENS) // 2
        mask = [0 if start <= i < start + TOOL_TOKENS else 1 for i in range(length)]
        rows.append((ids, mask))
    return rows


def action_logps(model, prompt: list[int], rows, noise: float, seed: int) -> list[list[float]]:
    """Per-action log-probs of `model` plus noise: the sampling policy's or the reference's."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    with torch.no_grad():
        for ids, mask in rows:
            full = torch.tensor([prompt + ids])
            logps = model(input_ids=full).logits[0, :-1].log_softmax(-1)
            picked = logps.gather(1, full[0, 1:, None])[:, 0][len(prompt) - 1 :]
            kept = picked[torch.tensor(mask).bool()]
            out.append((kept + noise * torch.randn(kept.shape, generator=generator)).tolist())
    return out


def timed_step(model, optimizer, loss_fn) -> tuple[float, float]:
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn()
    loss.backward()
    optimizer.step()
    return time.perf_counter() - start, float(loss.detach())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="timed steps of each, after one")
    parser.add_argument("--aggregation", default="dapo", choices=("grpo", "dapo", "dr_grpo"))
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    shape = LlamaConfig(
        vocab_size=VOCAB, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4,
        max_position_embeddings=512, tie_word_embeddings=True,
    )  # fmt: skip
    ours = LlamaForCausalLM(shape).float()
    prompt = torch.randint(3, VOCAB, (PROMPT_TOKENS,)).tolist()
    rows = [row for g in range(args.groups) for row in completions(args.samples, g)]
    old = action_logps(ours, prompt, rows, 0.1, 1)
    ref = action_logps(ours, prompt, rows, 0.1, 2)
    advantages = torch.randn(len(rows)).tolist()
    settings = GRPOSettings(aggregation=args.aggregation, beta=0.04, clip_high=0.28)
    seqs = [MaskedSequence(prompt + ids, [0] * PROMPT_TOKENS + mask) for ids, mask in rows]
    batch = grpo_batch(seqs, old, ref, advantages, [True] * len(rows), 0)
    theirs = trl_trainer(trl_model(ours), settings)
    inputs = trl_inputs(prompt, rows, old, ref, advantages)
    sides = {
        "reasonrl": (ours, lambda: grpo_loss(ours, batch, settings)[0]),
        "TRL": (theirs.model, lambda: trl_grpo_loss(theirs, inputs)),
    }
    optimizers = {
        name: torch.optim.AdamW(m.parameters(), lr=1e-6) for name, (m, _) in sides.items()
    }
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    first = {}
    for name in ("reasonrl", "TRL"):  # warm-up, and the same first loss
        _, first[name] = timed_step(sides[name][0], optimizers[name], sides[name][1])
    if abs(first["reasonrl"] - first["TRL"]) > 1e-4 * max(1.0, abs(first["TRL"])):
        sys.exit(f"grpo_step: first losses differ {first}: not the same work")
    for step in range(args.steps):
        for name in ("reasonrl", "TRL") if step % 2 == 0 else ("TRL", "reasonrl"):
            seconds[name].append(timed_step(sides[name][0], optimizers[name], sides[name][1])[0])
    actions = int(batch["action_mask"].sum())
    mean = {name: statistics.mean(values) for name, values in seconds.items()}
    params = sum(p.numel() for p in ours.parameters()) / 1e6
    rows_out = [
        ("model", f"Llama, {params:.1f}M parameters ({args.layers} layers, hidden {args.hidden})"),
        ("batch", f"{args.groups} groups x {args.samples} samples, prompt {PROMPT_TOKENS} tokens,"
                  f" completions 32-256 with a {TOOL_TOKENS}-token interpreter turn masked"),
        ("trained action tokens per step", str(actions)),
        ("loss", f"{args.aggregation}, beta 0.04 (k3 KL), clip 0.2 / 0.28"),
        ("first step's loss, reasonrl / TRL", f"{first['reasonrl']:.6f} / {first['TRL']:.6f}"),
        ("steps timed each (interleaved)", str(args.steps)),
        *[(f"{name}: s per step (mean)", f"{mean[name]:.3f}") for name in sides],
        *[(f"{name}: action tokens/s", f"{actions / mean[name]:.0f}") for name in sides],
        ("reasonrl / TRL step time", f"{mean['reasonrl'] / mean['TRL']:.2f}x"),
    ]  # fmt: skip
    append(
        "GRPO step: reasonrl's loss vs TRL's GRPOTrainer loss (same model, same batch, CPU)",
        rows_out,
        f"reasonrl's GRPO step takes {mean['reasonrl'] / mean['TRL']:.2f}x TRL's time",
    )


if __name__ == "__main__":
    main()
