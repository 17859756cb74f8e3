"""A PPO run's settings, typed once at the stage (stages.ppo) from the ppo config section with
the job's grad_accum (training.loop.with_accumulation): the run reads these fields, not the
section. (training.ppo.PPOSettings is the loss's part of them.)"""

from __future__ import annotations

from dataclasses import dataclass

from reasonrl.generation import SamplingParams
from reasonrl.training.ppo import PPOSettings


@dataclass(frozen=True)
class PPORunSettings:
    style: str  # the solution style the policy is prompted with
    reward: str  # rm, oracle or combined
    critic: str  # separate or shared
    iterations: int
    prompts_per_iteration: int
    responses_per_prompt: int
    draws_per_prompt: int
    heldout_prompts: int
    ppo_epochs: int
    batch_size: int
    grad_accum: int  # this job's: global_batch_size's share where it is set
    policy_lr: float
    critic_lr: float
    normalise_rewards: bool
    normalise_advantages: bool
    max_length: int
    max_grad_norm: float
    lr_schedule: str
    optimizer: str
    gradient_checkpointing: bool
    checkpoint_iterations: int
    sampling: SamplingParams  # its seed is the run's; each iteration samples with its own
    loss: PPOSettings  # beta (the KL coefficient), gamma, lam and the clips
    seed: int

    @classmethod
    def from_section(cls, section: dict, seed: int) -> PPORunSettings:
        """`section`: ppo with the job's grad_accum; `seed`: the config's."""
        names = cls.__dataclass_fields__.keys() - {"sampling", "loss", "seed"}
        return cls(
            **{k: section[k] for k in names},
            sampling=SamplingParams.from_section(section, seed),
            loss=PPOSettings.from_config(section),
            seed=seed,
        )
