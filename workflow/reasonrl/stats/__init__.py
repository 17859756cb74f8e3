"""Statistics: evaluation metrics (pass@k, maj@k, bootstrap CIs), pre-registered paired
comparisons, the start policy's calibration gates, and result tables."""
