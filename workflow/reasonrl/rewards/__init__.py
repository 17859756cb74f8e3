"""Reward models and process supervision.

steps: solutions as steps, and the chat formats the reward models read (PRM, ORM, BT).
scoring: P("+") of every step in one forward pass, ORM and Bradley-Terry scores, aggregation.
pairs: Bradley-Terry preference pairs (maximum edit distance among SFT samples).
annotation: Math-Shepherd step labels from K completions of every step prefix.
mutation: code PRM data from one-node AST mutations checked by unit tests.
models: reward-model training examples, held-out metrics, loading a trained one.
trainers: training a BT-RM, ORM or PRM through the shared loop (losses in training.reward and
training.lm_loss; the `train-reward-model` stage in stages.reward_models).
reranking: every reward model's score of every sampled solution (best-of-N).
settings: the reward_models section typed, once at each stage (RewardModelSettings).
"""
