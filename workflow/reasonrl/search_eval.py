"""Stage bodies of the search rules: best-of-N reranking and HGS-PRM decoding on a test split."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from reasonrl.chat import render
from reasonrl.errors import ReasonRLError
from reasonrl.generation import SamplingParams, make_engine
from reasonrl.io import read_jsonl, write_csv, write_json, write_jsonl
from reasonrl.manifest import Provenance
from reasonrl.rewards.scoring import (
    AGGREGATIONS,
    aggregate,
    bt_scores,
    orm_scores,
    score_steps,
    step_classes,
    step_goodness,
)
from reasonrl.rewards.steps import solution_step_texts, to_rlhflow, trajectory_steps
from reasonrl.rewards.training import load_reward_model
from reasonrl.rollout import RolloutLimits, RolloutPrefix, continue_rollouts, run_rollouts
from reasonrl.sandbox import Sandbox
from reasonrl.search import best_of_n_metrics, run_hgs, sample_then_filter
from reasonrl.tasks import prompt_messages
from reasonrl.tasks.grading import normalize_answer

log = logging.getLogger(__name__)


def _test_problems(path: str, limit: int) -> list[dict]:
    problems = read_jsonl(path, schema="problem")
    return problems[:limit] if limit else problems


def _group(rows: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for row in sorted(rows, key=lambda r: r["sample"]):
        groups.setdefault(row["problem_id"], []).append(row)
    return groups


def score_samples(
    config: dict, problems: dict[str, dict], rows: list[dict], models: dict[str, str]
) -> list[dict]:
    """Every reward model's score of every sampled solution, and the PRM's step verdicts."""
    section, dtype = config["reward_models"], config["policy"]["dtype"]
    items = [
        (
            problems[r["problem_id"]]["question"],
            solution_step_texts(problems[r["problem_id"]], r["messages"], section),
        )
        for r in rows
    ]
    scored = [
        {
            "problem_id": r["problem_id"],
            "sample": r["sample"],
            "correct": r["correct"],
            "scores": {},
        }
        for r in rows
    ]
    for kind, folder in models.items():
        model, tokenizer, info = load_reward_model(folder, dtype)
        if kind == "bt":
            values = bt_scores(model, tokenizer, [render(tokenizer, r["messages"]) for r in rows])
            for s, v in zip(scored, values, strict=True):
                s["scores"]["bt"] = v
        elif kind == "orm":
            for s, v in zip(scored, orm_scores(model, tokenizer, items), strict=True):
                s["scores"]["orm"] = v
        else:
            labels = info["labels"]
            probs = score_steps(model, tokenizer, items, labels)
            for s, p in zip(scored, probs, strict=True):
                goodness = step_goodness(p, labels)
                for how in AGGREGATIONS:
                    s["scores"][f"prm-{how}"] = aggregate(goodness, how)
                s["step_labels"] = step_classes(p, labels, section["hgs"]["neutral_band"])
    return scored


def best_of_n(
    config: dict,
    policy: str,
    problems_path: str,
    reward_models: dict[str, str],
    out_dir: str,
) -> dict:
    """Sample max(N) solutions per test problem (and a greedy one), score them with every
    reward model, and tabulate pass@1, maj@N and RM@N with bootstrap CIs."""
    section, seed = config["reward_models"], config["seed"]
    inputs = [policy, problems_path, *reward_models.values()]
    provenance = Provenance("best-of-n", config, inputs, seed)
    problems = _test_problems(problems_path, section["best_of_n"]["max_problems"])
    n_max = max(section["best_of_n"]["n"])
    generation = config["generation"]
    engine = make_engine(generation["engine"], policy, generation, config["policy"]["dtype"])
    sandbox = Sandbox.from_config(config["sandbox"])
    limits = RolloutLimits.from_config(config["rollout"])
    style = section["style"]
    greedy = run_rollouts(engine, problems, style, 1, SamplingParams(seed=seed), limits, sandbox)
    params = SamplingParams(
        temperature=section["temperature"], top_p=section["top_p"], seed=seed + 101
    )
    sampled = run_rollouts(engine, problems, style, n_max, params, limits, sandbox)
    by_id = {p["id"]: p for p in problems}
    scored = score_samples(config, by_id, sampled, reward_models)
    scorers = sorted({k for s in scored for k in s["scores"]})
    groups = []
    for pid, rows in _group(sampled).items():
        scores = {s["sample"]: s["scores"] for s in scored if s["problem_id"] == pid}
        groups.append(
            {
                "correct": [r["correct"] for r in rows],
                "answers": [
                    None if r["final_answer"] is None else normalize_answer(r["final_answer"])
                    for r in rows
                ],
                "scores": {k: [scores[r["sample"]][k] for r in rows] for k in scorers},
            }
        )
    table = best_of_n_metrics(groups, section["best_of_n"]["n"], scorers)
    greedy_correct = np.array([float(r["correct"]) for r in greedy])
    table["greedy_pass@1"] = float(greedy_correct.mean())
    out = Path(out_dir)
    write_jsonl(out / "greedy.jsonl", greedy, schema="trajectory")
    write_jsonl(out / "samples.jsonl", sampled, schema="trajectory")
    write_jsonl(out / "scores.jsonl", scored)
    rlhflow = [
        to_rlhflow(
            by_id[pid]["question"],
            [solution_step_texts(by_id[pid], r["messages"], section) for r in rows],
            [r["correct"] for r in rows],
        )
        for pid, rows in _group(sampled).items()
    ]
    write_jsonl(out / "rlhflow.jsonl", rlhflow)
    write_json(out / "best_of_n.json", table)
    write_csv(out / "best_of_n.csv", table["rows"])
    provenance.write(out, {"greedy_pass@1": table["greedy_pass@1"]})
    return table


class ToolStepModel:
    """HGS-PRM's model and PRM for tool-integrated trajectories: a step is one model turn
    (with the interpreter's output); an expansion samples one turn from the current path."""

    def __init__(self, config: dict, engine, prm_folder: str, problems: list[dict]):
        section = config["reward_models"]
        if section["step_splitter"] != "turn":
            raise ReasonRLError(
                "hgs needs reward_models.step_splitter: turn (a step = a model turn)"
            )
        self.config, self.engine, self.problems = config, engine, problems
        self.section, self.seed = section, config["seed"]
        self.sandbox = Sandbox.from_config(config["sandbox"])
        self.limits = RolloutLimits.from_config(config["rollout"])
        self.prm, self.tokenizer, info = load_reward_model(prm_folder, config["policy"]["dtype"])
        self.labels = info["labels"]
        self.generated = [0] * len(problems)

    def _prefix(self, index: int, path: list) -> list[dict]:
        if path:
            return path[-1]["messages"]
        return prompt_messages(self.problems[index], self.section["style"])

    def expand(self, ids: list[int], paths: list[list], round_no: int) -> list[tuple[dict, bool]]:
        params = SamplingParams(
            temperature=self.section["temperature"],
            top_p=self.section["top_p"],
            seed=self.seed + 1009 * (round_no + 1),
        )
        out: list[tuple[dict, bool] | None] = [None] * len(ids)
        by_turns: dict[int, list[int]] = {}
        for j, path in enumerate(paths):
            by_turns.setdefault(len(path), []).append(j)
        for turns, members in by_turns.items():
            limits = RolloutLimits(
                turns + 1, self.limits.max_turn_tokens, self.limits.max_total_tokens
            )
            prefixes = [
                RolloutPrefix(self.problems[ids[j]], self._prefix(ids[j], paths[j]))
                for j in members
            ]
            rows = continue_rollouts(self.engine, prefixes, params, limits, self.sandbox)
            for j, row in zip(members, rows, strict=True):
                self.generated[ids[j]] += 1
                final = row["finish_reason"] != "max_turns" or turns + 1 >= self.limits.max_turns
                out[j] = ({"messages": row["messages"], "row": row}, final)
        return out

    def label(self, ids: list[int], paths: list[list], steps: list[dict]) -> list[str]:
        items = [
            (
                self.problems[i]["question"],
                [s.text for s in trajectory_steps(step["messages"], "turn", "")],
            )
            for i, step in zip(ids, steps, strict=True)
        ]
        probs = score_steps(self.prm, self.tokenizer, items, self.labels)
        band = self.section["hgs"]["neutral_band"]
        return [step_classes(p[-1:], self.labels, band)[0] for p in probs]

    def finish(self, searches) -> list[dict]:
        """The trajectory of each search: its accepted answer, or its state completed greedily."""
        rows: list[dict | None] = [None] * len(searches)
        todo = []
        for i, search in enumerate(searches):
            if search.finished == "answer":
                rows[i] = search.path()[-1]["row"]
            else:
                todo.append(i)
        prefixes = [
            RolloutPrefix(self.problems[i], self._prefix(i, searches[i].path())) for i in todo
        ]
        done = (
            continue_rollouts(
                self.engine, prefixes, SamplingParams(seed=self.seed), self.limits, self.sandbox
            )
            if todo
            else []
        )
        for i, row in zip(todo, done, strict=True):
            self.generated[i] += row["num_turns"] - len(searches[i].path())
            rows[i] = row
        return rows


def hgs_search(
    config: dict, policy: str, prm: str, problems_path: str, best_of_n_dir: str, out_dir: str
) -> dict:
    """HGS-PRM vs greedy vs sample-then-filter on the same test problems (greedy decoding and
    the samples come from the best-of-N stage)."""
    section, seed = config["reward_models"], config["seed"]
    bon = Path(best_of_n_dir)
    inputs = [policy, prm, problems_path, str(bon / "scores.jsonl")]
    provenance = Provenance("hgs-search", config, inputs, seed)
    problems = _test_problems(problems_path, section["hgs"]["max_problems"])
    ids = {p["id"] for p in problems}
    greedy = [
        r for r in read_jsonl(bon / "greedy.jsonl", schema="trajectory") if r["problem_id"] in ids
    ]
    samples = [
        r for r in read_jsonl(bon / "samples.jsonl", schema="trajectory") if r["problem_id"] in ids
    ]
    scores = {(s["problem_id"], s["sample"]): s for s in read_jsonl(bon / "scores.jsonl")}
    if len(greedy) != len(problems):
        raise ReasonRLError(f"{bon}/greedy.jsonl: has no greedy run of some of the problems")
    generation = config["generation"]
    engine = make_engine(generation["engine"], policy, generation, config["policy"]["dtype"])
    stepper = ToolStepModel(config, engine, prm, problems)
    hgs = section["hgs"]
    searches = run_hgs(
        len(problems), stepper.expand, stepper.label, hgs["max_bandwidth"], hgs["max_iterations"]
    )
    rows = stepper.finish(searches)
    n_filter = hgs["filter_samples"]
    kept = [g[:n_filter] for g in _group(samples).values()]
    filtered = sample_then_filter(
        [[scores[(r["problem_id"], r["sample"])]["step_labels"] for r in g] for g in kept],
        [[r["correct"] for r in g] for g in kept],
    )
    metrics = {
        "n_problems": len(problems),
        "greedy": {
            "accuracy": float(np.mean([r["correct"] for r in greedy])),
            "steps_per_problem": float(np.mean([r["num_turns"] for r in greedy])),
        },
        "hgs": {
            "accuracy": float(np.mean([r["correct"] for r in rows])),
            "steps_per_problem": float(np.mean(stepper.generated)),
            "finished": {
                k: sum(s.finished == k for s in searches) for k in ("answer", "cap", "exhausted")
            },
            "backtracks": sum(e[0] == "backtrack" for s in searches for e in s.events),
        },
        "sample_then_filter": {
            **filtered,
            "n": n_filter,
            "steps_per_problem": float(np.mean([sum(r["num_turns"] for r in g) for g in kept])),
        },
    }
    out = Path(out_dir)
    write_jsonl(out / "trajectories.jsonl", rows, schema="trajectory")
    write_json(out / "hgs.json", metrics)
    write_csv(
        out / "hgs.csv",
        [
            {"method": "greedy", **metrics["greedy"]},
            {
                "method": "hgs-prm",
                "accuracy": metrics["hgs"]["accuracy"],
                "steps_per_problem": metrics["hgs"]["steps_per_problem"],
            },
            {
                "method": f"sample{n_filter}-then-filter",
                "accuracy": filtered["accuracy_after"],
                "steps_per_problem": metrics["sample_then_filter"]["steps_per_problem"],
            },
        ],
    )
    provenance.write(out, {"hgs_accuracy": metrics["hgs"]["accuracy"]})
    return metrics


def score_rlhflow(config: dict, path: str, reward_models: dict[str, str], out_dir: str) -> dict:
    """Best-of-N of an RLHFlow evaluation file (prompt, answers, labels: e.g. their
    MATH500 / GSM8K test sets) reranked by our reward models; answers are split into steps
    at blank lines, as the RLHFlow evaluation scripts do."""
    from reasonrl.rewards.steps import from_rlhflow
    from reasonrl.tasks.grading import extract_answer

    section = config["reward_models"]
    provenance = Provenance(
        "score-rlhflow", config, [path, *reward_models.values()], config["seed"]
    )
    problems, rows = {}, []
    for lineno, row in enumerate(read_jsonl(path), start=1):
        question, solutions, correct = from_rlhflow(row, f"{path}:{lineno}")
        pid = f"rlhflow-{lineno:05d}"
        problems[pid] = {"id": pid, "question": question, "code": None}
        for sample, (steps, right) in enumerate(zip(solutions, correct, strict=True)):
            messages = [
                {"role": "user", "content": question},
                {"role": "assistant", "content": "\n\n".join(steps)},
            ]
            rows.append(
                {"problem_id": pid, "sample": sample, "messages": messages, "correct": right}
            )
    text_section = {**section, "step_splitter": "regex", "split_pattern": r"\n\s*\n"}
    scored = score_samples({**config, "reward_models": text_section}, problems, rows, reward_models)
    scorers = sorted({k for s in scored for k in s["scores"]})
    groups = []
    for pid, members in _group(rows).items():
        scores = {s["sample"]: s["scores"] for s in scored if s["problem_id"] == pid}
        answers = [extract_answer(r["messages"][-1]["content"]) for r in members]
        groups.append(
            {
                "correct": [r["correct"] for r in members],
                "answers": [None if a is None else normalize_answer(a) for a in answers],
                "scores": {k: [scores[r["sample"]][k] for r in members] for k in scorers},
            }
        )
    table = best_of_n_metrics(groups, section["best_of_n"]["n"], scorers)
    out = Path(out_dir)
    write_json(out / "best_of_n.json", table)
    write_csv(out / "best_of_n.csv", table["rows"])
    provenance.write(out, {"n_problems": table["n_problems"]})
    return table
