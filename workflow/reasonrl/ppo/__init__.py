"""PPO and PF-PPO: one run (models, prompts, experience, the update loop's parts) and its
policy filtration (which sampled responses train); the losses live in training.ppo."""
