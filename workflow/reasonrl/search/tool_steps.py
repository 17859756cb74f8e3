"""HGS-PRM's step model for tool-integrated trajectories: a search step is one model turn (with
the interpreter's output); expanding samples one turn from the current path through the
rollout loop, and the PRM labels it by its verdict on the turn's last step under the
configured splitter (with `line`, the line that ends the turn: the PRM reads the trajectory
exactly as it was trained to, and that verdict covers every line of the turn before it).

Why the search does not branch at every line: an expansion would have to stop generation at
a line break and resume a half-written turn; the rollout loop stops only at turn ends."""

from __future__ import annotations

import copy
import dataclasses

from reasonrl.generation import SamplingParams
from reasonrl.rewards.models import load_reward_model
from reasonrl.rewards.scoring import score_steps, step_classes
from reasonrl.rewards.settings import RewardModelSettings
from reasonrl.rewards.steps import trajectory_steps
from reasonrl.rollout import RolloutPrefix, RolloutSettings, continue_rollouts, run_rollouts
from reasonrl.sandbox import Sandbox
from reasonrl.tasks import prompt_messages

# The compute-matched samples' seeds start this far from the search's (which add 1009 per
# round): distinct streams within a shard's SEED_STRIDE.
MATCHED_SEED_OFFSET = 500_009


class ToolStepModel:
    """HGS-PRM's model and PRM for tool-integrated trajectories: a search step is one model
    turn (with the interpreter's output); an expansion samples one turn from the current path.

    `settings`: the stage's (style, sampling, step splitter, HGS's neutral band); `limits` and
    `sandbox` the rollouts'; the PRM in `prm_folder` is loaded in `dtype`, the policy's."""

    def __init__(
        self,
        settings: RewardModelSettings,
        engine,
        prm_folder: str,
        limits: RolloutSettings,
        sandbox: Sandbox,
        dtype: str,
    ):
        self.settings, self.engine = settings, engine
        self.seed = settings.seed
        self.sandbox, self.limits = sandbox, limits
        self.prm, self.tokenizer, info = load_reward_model(prm_folder, dtype)
        self.labels = info["labels"]
        self.problems: list[dict] = []
        self.generated: list[int] = []  # policy calls (model turns) per problem
        self.tokens: list[int] = []  # tokens those calls generated

    def for_problems(self, problems: list[dict], seed: int) -> ToolStepModel:
        """This model (engine and PRM shared) searching `problems` with its own `seed`: a
        shard's search depends only on its problems and seed."""
        model = copy.copy(self)
        model.problems, model.seed = problems, seed
        model.generated, model.tokens = [0] * len(problems), [0] * len(problems)
        return model

    def _count(self, index: int, row: dict, calls: int) -> None:
        self.generated[index] += calls
        self.tokens[index] += row["num_tokens"]  # a continuation counts only its own tokens

    def _prefix(self, index: int, path: list) -> list[dict]:
        if path:
            return path[-1]["messages"]
        return prompt_messages(self.problems[index], self.settings.style)

    def expand(self, ids: list[int], paths: list[list], round_no: int) -> list[tuple[dict, bool]]:
        params = dataclasses.replace(self.settings.sampling, seed=self.seed + 1009 * (round_no + 1))
        out: list[tuple[dict, bool] | None] = [None] * len(ids)
        by_turns: dict[int, list[int]] = {}
        for j, path in enumerate(paths):
            by_turns.setdefault(len(path), []).append(j)
        for turns, members in by_turns.items():
            limits = dataclasses.replace(self.limits, max_turns=turns + 1)
            prefixes = [
                RolloutPrefix(self.problems[ids[j]], self._prefix(ids[j], paths[j]))
                for j in members
            ]
            rows = continue_rollouts(self.engine, prefixes, params, limits, self.sandbox)
            for j, row in zip(members, rows, strict=True):
                self._count(ids[j], row, 1)
                final = row["finish_reason"] != "max_turns" or turns + 1 >= self.limits.max_turns
                out[j] = ({"messages": row["messages"], "row": row}, final)
        return out

    def label(self, ids: list[int], paths: list[list], steps: list[dict]) -> list[str]:
        splitter, pattern = self.settings.step_splitter, self.settings.split_pattern
        items = [
            (
                self.problems[i]["question"],
                [s.text for s in trajectory_steps(step["messages"], splitter, pattern)],
            )
            for i, step in zip(ids, steps, strict=True)
        ]
        probs = score_steps(self.prm, self.tokenizer, items, self.labels)
        band = self.settings.hgs.neutral_band
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
            self._count(i, row, row["num_turns"] - len(searches[i].path()))
            rows[i] = row
        return rows

    def sample(self, ids: list[int], calls_left: list[int], round_no: int) -> list[dict]:
        """One full sample per problem at the search's temperature, made with at most its
        calls left (model turns, counted as the search counts them): the compute-matched
        baseline's sampler (reasonrl.search.hgs.sample_to_budget)."""
        seed = self.seed + MATCHED_SEED_OFFSET + 1009 * round_no
        params = dataclasses.replace(self.settings.sampling, seed=seed)
        out: list[dict | None] = [None] * len(ids)
        by_cap: dict[int, list[int]] = {}
        for j, left in enumerate(calls_left):
            by_cap.setdefault(min(left, self.limits.max_turns), []).append(j)
        for cap, members in by_cap.items():
            limits = dataclasses.replace(self.limits, max_turns=cap)
            problems = [self.problems[ids[j]] for j in members]
            style = self.settings.style
            rows = run_rollouts(self.engine, problems, style, 1, params, limits, self.sandbox)
            for j, row in zip(members, rows, strict=True):
                out[j] = row
        return out
