"""`privacylab dpforward train`: DP-Forward, DP-SGD and non-private fine-tuning (placeholder)."""
