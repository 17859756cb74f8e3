"""Online RLHF (asynchronous RLHF paper): generator process, learner, stages."""
