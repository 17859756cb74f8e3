"""An online run's settings, typed once at the stage (stages.online_dpo) from the online_dpo
config section with its variant's keys: the generator and the learner read these fields, not
the section."""

from __future__ import annotations

from dataclasses import dataclass

from reasonrl.errors import ReasonRLError
from reasonrl.generation import SamplingParams
from reasonrl.online_dpo.actors import Schedule
from reasonrl.training.grpo import GRPOSettings
from reasonrl.training.loop import LoopSettings


@dataclass(frozen=True)
class OnlineDPOSettings:
    mode: str  # sync or async
    loss: str  # dpo, rloo, ppo or grpo
    reward: str  # oracle, rm or combined
    off_policy: int  # N, mini-batches (optimizer steps) per generation round
    prompts_per_step: int
    micro_batch_prompts: int  # the config's null resolved: all of a step's prompts
    samples_per_prompt: int  # K
    reference_rows: int  # sequences per forward pass of the reference's log-probs
    sampling: SamplingParams  # its seed is the run's; each round samples with its own
    beta: float  # DPO beta; Proximal RLOO's and PPO's KL penalty coefficient
    clip: float
    eos_penalty: float
    critic_lr: float
    max_length: int
    # The loop's settings but its grad_accum (1 here): that is the share of a step's
    # micro-batches per process, which only the job knows (learner.loop_settings).
    loop: LoopSettings
    grpo: GRPOSettings | None = None  # the variant's grpo keys, where its loss is grpo

    @classmethod
    def from_section(
        cls, section: dict, seed: int, max_tokens: int | None = None
    ) -> OnlineDPOSettings:
        """`section`: online_dpo with the variant's keys; `seed`: the config's; `max_tokens`:
        rollout.max_total_tokens (loss grpo: Dr. GRPO's constant, DAPO's overlong length)."""
        loop = {**section, "max_steps": section["steps"], "grad_accum": 1, "weight_decay": 0.0}
        grpo = None
        if section["loss"] == "grpo":
            if max_tokens is None:
                raise ReasonRLError("online_dpo: loss grpo needs rollout.max_total_tokens")
            grpo = GRPOSettings.from_section(section["grpo"], section["clip"], max_tokens)
        return cls(
            mode=section["mode"],
            loss=section["loss"],
            reward=section["reward"],
            off_policy=section["off_policy"],
            prompts_per_step=section["prompts_per_step"],
            micro_batch_prompts=section["micro_batch_prompts"] or section["prompts_per_step"],
            samples_per_prompt=section["samples_per_prompt"],
            reference_rows=section["reference_rows"],
            sampling=SamplingParams.from_section(section, seed),
            beta=section["beta"],
            clip=section["clip"],
            eos_penalty=section["eos_penalty"],
            critic_lr=section["critic_lr"],
            max_length=section["max_length"],
            loop=LoopSettings.from_config(loop, seed),
            grpo=grpo,
        )

    @property
    def per_token(self) -> bool:
        """Whether the loss's ratio is per token (PPO, GRPO): the generator's and the
        reference's log-probs are then kept per token, not summed."""
        return self.loss in ("ppo", "grpo")

    @property
    def steps(self) -> int:
        return self.loop.max_steps

    @property
    def seed(self) -> int:
        return self.loop.seed

    @property
    def schedule(self) -> Schedule:
        """The rounds: `steps` optimizer steps, `off_policy` per round, lagging one in async."""
        return Schedule(self.steps, self.off_policy, self.mode == "async")
