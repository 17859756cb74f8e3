"""M-DPO training step time and peak memory: cached reference log-probs vs a live reference.

Both modes train the same policy on the same arith pairs (gold tool trajectory vs the same
trajectory with a wrong answer) with the same loss; "cached" reads the reference log-probs
computed once before training (as the reference_logps rule does), "live" keeps the reference
model resident and runs it every step (as TRL does without precomputation). Each mode runs in
its own fresh process, so peak RSS is its own.

python bench/mdpo_reference_cache.py [--steps 20] [--config config/config.yaml]
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing
import resource
import tempfile
import time

from record import append


def make_pairs(config: dict, count: int) -> list[dict]:
    from reasonrl.tasks import build_problems, prompt_messages, solution_messages

    train, _ = build_problems("arith", config["tasks"]["arith"], config["seed"])
    pairs = []
    for problem in train[:count]:
        chosen = prompt_messages(problem, "tool") + solution_messages(problem, "tool")
        rejected = copy.deepcopy(chosen)
        rejected[-1]["content"] = f"The answer is \\boxed{{{int(problem['answer']) + 1}}}."
        pairs.append({"problem_id": problem["id"], "chosen": chosen, "rejected": rejected})
    return pairs


def sequences(model_dir: str, config: dict, steps: int):
    from reasonrl.models import load_tokenizer
    from reasonrl.training.preference import pair_sequences

    section = config["preference"]["train"]
    tokenizer = load_tokenizer(model_dir)
    pairs = make_pairs(config, section["batch_size"] * (steps + 1))
    return pair_sequences(tokenizer, pairs, True, section["max_length"]), tokenizer.pad_token_id


def cached_reference(model_dir: str, config: dict, steps: int) -> list[tuple[float, float]]:
    """What the reference_logps rule writes: computed in another process, before training."""
    from reasonrl.models import load_policy
    from reasonrl.sequences import summed_logps

    items, pad = sequences(model_dir, config, steps)
    values = summed_logps(load_policy(model_dir)[0], [s for p in items for s in p], pad)
    return [(values[2 * i], values[2 * i + 1]) for i in range(len(items))]


def run_mode(mode: str, model_dir: str, config: dict, steps: int, cached, queue) -> None:
    import torch

    from reasonrl.models import load_policy
    from reasonrl.training.preference import LossSettings, PreferenceBatches, PreferenceObjective

    torch.manual_seed(0)
    model, _ = load_policy(model_dir)
    items, pad = sequences(model_dir, config, steps)
    batch_size = config["preference"]["train"]["batch_size"]
    reference_model = None
    if mode == "live":
        reference_model = load_policy(model_dir)[0].eval()
        for p in reference_model.parameters():
            p.requires_grad_(False)
    batches = PreferenceBatches(items, batch_size, pad, 0, reference=cached)
    resident = sum(p.numel() for p in model.parameters())
    if reference_model is not None:
        resident += sum(p.numel() for p in reference_model.parameters())
    objective = PreferenceObjective(LossSettings("mdpo"), reference_model=reference_model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model.train()

    def step(i: int) -> None:
        loss, _ = objective(model, batches(i))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    step(0)  # warm-up outside the clock
    started = time.perf_counter()
    for i in range(1, steps + 1):
        step(i)
    seconds = (time.perf_counter() - started) / steps
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put(
        {
            "mode": mode,
            "step_seconds": seconds,
            "peak_mb": peak_mb,
            "resident": resident,
            "reference_seconds": reference_pass_seconds(model, batches, steps),
        }
    )


def reference_pass_seconds(model, batches, steps: int) -> float:
    """Seconds per step of what a live reference adds: a forward pass without gradients over
    the step's batch (the same model and shapes as the reference)."""
    import torch

    from reasonrl.sequences import sequence_logps

    model.eval()
    started = time.perf_counter()
    with torch.no_grad():
        for i in range(1, steps + 1):
            sequence_logps(model, batches(i))
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    from reasonrl.config import load_config
    from reasonrl.io import write_jsonl
    from reasonrl.models import build_tiny_policy
    from reasonrl.stages.models import corpus_texts
    from reasonrl.tasks import build_problems

    config = load_config(args.config)
    context = multiprocessing.get_context("spawn")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        train, _ = build_problems("arith", config["tasks"]["arith"], config["seed"])
        write_jsonl(f"{tmp}/train.jsonl", train, schema="problem")
        build_tiny_policy(
            corpus_texts([f"{tmp}/train.jsonl"]), config["policy"]["tiny"], 0, f"{tmp}/m"
        )
        cached = cached_reference(f"{tmp}/m", config, args.steps)
        for mode in ("live", "cached"):
            queue = context.Queue()
            process = context.Process(
                target=run_mode,
                args=(
                    mode,
                    f"{tmp}/m",
                    config,
                    args.steps,
                    cached if mode == "cached" else None,
                    queue,
                ),
            )
            process.start()
            results[mode] = queue.get()
            process.join()
    live, cached = results["live"], results["cached"]
    speedup = live["step_seconds"] / cached["step_seconds"]
    # The most a cache can save is the reference's forward pass: the policy's forward and
    # backward stay, so with backward about twice forward the bound is near 4/3.
    ideal = (cached["step_seconds"] + cached["reference_seconds"]) / cached["step_seconds"]
    weights = cached["resident"] / live["resident"]
    batch = config["preference"]["train"]["batch_size"]
    append(
        "M-DPO training: cached reference log-probs vs a live reference model",
        [
            ("step time, live reference (s)", f"{live['step_seconds']:.3f}"),
            ("step time, cached reference (s)", f"{cached['step_seconds']:.3f}"),
            ("live / cached step time", f"{speedup:.2f}x"),
            ("reference forward pass alone, per step (s)", f"{cached['reference_seconds']:.3f}"),
            ("ideal live / cached: (cached step + reference pass) / cached step", f"{ideal:.2f}x"),
            ("check: achieved <= ideal (+5% noise)", "yes" if speedup <= 1.05 * ideal else "no"),
            ("peak RSS, live reference (MiB)", f"{live['peak_mb']:.0f}"),
            ("peak RSS, cached reference (MiB)", f"{cached['peak_mb']:.0f}"),
            ("resident weights, live / cached", f"{live['resident']} / {cached['resident']}"),
            ("cached / live resident weights", f"{weights:.2f}"),
            ("micro-batch", f"{batch} pairs of arith tool trajectories"),
            ("steps timed each", str(args.steps)),
        ],
        f"cached reference: {speedup:.2f}x faster steps (target >= 1.5x), "
        f"{weights:.2f} of the resident weights (target about 0.5); ideal from this run's own "
        f"timings {ideal:.2f}x",
    )


if __name__ == "__main__":
    main()
