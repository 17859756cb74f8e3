"""Asynchronous online DPO (asynchronous RLHF paper): the generator process and the learner
batches (the stage is stages.online_dpo, the losses training.online_dpo)."""
