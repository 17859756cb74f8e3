"""The iterative preference rounds: prompt augmentation and labelling (the stages are
stages.preference, the losses training.preference)."""
