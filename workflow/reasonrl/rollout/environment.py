"""What a rollout needs of the config, typed once at a stage: the engine that samples
(generation), the turn and token caps (rollout), the sandbox that runs the code cells, and the
policy's dtype. Picklable: a generator process of its own receives it."""

from __future__ import annotations

from dataclasses import dataclass

from reasonrl.generation import EngineSettings
from reasonrl.rollout.loop import RolloutSettings
from reasonrl.sandbox import SandboxSettings


@dataclass(frozen=True)
class RolloutEnvironment:
    generation: EngineSettings
    limits: RolloutSettings
    sandbox: SandboxSettings
    dtype: str

    @classmethod
    def from_config(cls, config: dict) -> RolloutEnvironment:
        """From the config's generation, rollout, sandbox and policy sections."""
        return cls(
            EngineSettings.from_section(config["generation"]),
            RolloutSettings.from_config(config["rollout"]),
            SandboxSettings.from_config(config["sandbox"]),
            config["policy"]["dtype"],
        )
