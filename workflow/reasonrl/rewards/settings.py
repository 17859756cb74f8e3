"""The reward models' settings, typed once at each stage of stages.reward_models from the
reward_models config section: the data makers, the trainers, the reranking and the HGS-PRM
search read these fields, not the section. (tasks, policy, task_policies, pooled and
hgs.tasks shape the DAG and are read by the rules, not by a stage.)"""

from __future__ import annotations

from dataclasses import dataclass

from reasonrl.generation import SamplingParams
from reasonrl.training.loop import LoopSettings


@dataclass(frozen=True)
class AnnotationSettings:
    solutions_per_prompt: int  # M, sampled solutions annotated per prompt
    completions: int  # K, completions rolled out from every step prefix


@dataclass(frozen=True)
class MutationSettings:
    max_problems: int
    max_mutants_per_line: int
    kinds: tuple[str, ...]
    cpu_seconds: float  # the sandbox's CPU limit per mutant run


@dataclass(frozen=True)
class RewardTrainSettings:
    batch_size: int  # chats (or pairs) per micro-batch
    max_length: int
    epochs: float | None  # when set, the steps are this many passes over the rows, not max_steps
    loop: LoopSettings  # max_steps: train.max_steps; grad_accum: as the section gives it

    @classmethod
    def from_section(cls, train: dict, seed: int) -> RewardTrainSettings:
        return cls(
            batch_size=train["batch_size"],
            max_length=train["max_length"],
            epochs=train["epochs"],
            loop=LoopSettings.from_config(train, seed),
        )


@dataclass(frozen=True)
class BestOfNSettings:
    n: tuple[int, ...]  # N of best-of-N; max(n) samples are drawn per problem
    max_problems: int  # test problems (0: all)


@dataclass(frozen=True)
class HGSSettings:
    max_bandwidth: int
    max_iterations: int
    max_problems: int  # test problems (0: all)
    filter_samples: int  # samples per problem for sample-then-filter
    neutral_band: tuple[float, float]  # a "+"/"-" PRM's P("+") between them is neutral


@dataclass(frozen=True)
class RewardModelSettings:
    style: str  # the solution style the policy is prompted with
    prompts: int  # train problems sampled for reward-model data
    samples_per_prompt: int
    bt_pairs: str  # farthest, random or all
    sampling: SamplingParams  # its seed is the run's; each use samples with its own
    heldout_fraction: float
    step_splitter: str  # line, turn or regex (trajectory_steps' splitter)
    split_pattern: str
    annotation: AnnotationSettings
    mutation: MutationSettings
    train: RewardTrainSettings
    best_of_n: BestOfNSettings
    hgs: HGSSettings

    @classmethod
    def from_section(cls, section: dict, seed: int) -> RewardModelSettings:
        """`section`: reward_models (the training stage's with train's grad_accum this job's,
        training.loop.with_accumulation); `seed`: the config's."""
        mutation, bon, hgs = section["mutation"], section["best_of_n"], section["hgs"]
        return cls(
            style=section["style"],
            prompts=section["prompts"],
            samples_per_prompt=section["samples_per_prompt"],
            bt_pairs=section["bt_pairs"],
            sampling=SamplingParams.from_section(section, seed),
            heldout_fraction=section["heldout_fraction"],
            step_splitter=section["step_splitter"],
            split_pattern=section["split_pattern"],
            annotation=AnnotationSettings(
                solutions_per_prompt=section["annotation"]["solutions_per_prompt"],
                completions=section["annotation"]["completions"],
            ),
            mutation=MutationSettings(
                max_problems=mutation["max_problems"],
                max_mutants_per_line=mutation["max_mutants_per_line"],
                kinds=tuple(mutation["kinds"]),
                cpu_seconds=mutation["cpu_seconds"],
            ),
            train=RewardTrainSettings.from_section(section["train"], seed),
            best_of_n=BestOfNSettings(tuple(bon["n"]), bon["max_problems"]),
            hgs=HGSSettings(
                max_bandwidth=hgs["max_bandwidth"],
                max_iterations=hgs["max_iterations"],
                max_problems=hgs["max_problems"],
                filter_samples=hgs["filter_samples"],
                neutral_band=tuple(hgs["neutral_band"]),
            ),
        )

    @property
    def seed(self) -> int:
        return self.sampling.seed
