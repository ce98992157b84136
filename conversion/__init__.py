"""Checkpoint conversion (original TF / PyTorch checkpoints and legacy transformers folders to Hub folders).

Not written yet: no issue asks for it so far (see README, Layout)."""
