"""Training: one shared loop (loop.py) and one loss module per method family."""
