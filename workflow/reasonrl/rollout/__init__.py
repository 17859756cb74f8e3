"""Rollouts: the multi-turn tool loop (loop), what a rollout needs of the config (environment),
and a generation engine in a process of its own that a training job drives (generator_process,
imported on its own)."""

from reasonrl.rollout.environment import RolloutEnvironment
from reasonrl.rollout.loop import (
    MAX_SESSIONS,
    SESSION_OPEN_SECONDS,
    STOP,
    WAVE_SEED_STRIDE,
    RolloutPrefix,
    RolloutSettings,
    continue_rollouts,
    last_code_block,
    needs_session,
    run_rollouts,
    session_cap,
)

__all__ = [
    "MAX_SESSIONS",
    "RolloutEnvironment",
    "RolloutPrefix",
    "RolloutSettings",
    "SESSION_OPEN_SECONDS",
    "STOP",
    "WAVE_SEED_STRIDE",
    "continue_rollouts",
    "last_code_block",
    "needs_session",
    "run_rollouts",
    "session_cap",
]
