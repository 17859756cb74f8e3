"""The training library: one shared loop (loop), collation and packing (data), and one loss
module per method family (lm_loss, preference, reward, ppo, online_dpo; filtration for
PF-PPO). It imports no stage, method, engine, rollout or sandbox (docs/architecture.md)."""
