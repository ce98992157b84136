"""Checkpoint conversion (original TF / PyTorch checkpoints and legacy transformers folders to Hub folders).

Each reader (`tf_checkpoint`, `original_pytorch`, `hf_legacy`) returns a `ConvertedCheckpoint`; `hub_export`
writes it as a Hub folder and verifies it; `cli` is `transformers-xl convert`."""
