"""The training library: one shared loop (loop), collation and packing (data), one loss
module per method family (lm_loss, preference, reward, ppo, online_dpo, grpo), and one node's
share of a job over several nodes (launch). It imports no stage, method, engine, rollout or
sandbox (docs/architecture.md)."""
