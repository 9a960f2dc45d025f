"""The trainer: DeepSpeed training on versioned datasets, checkpoints with lineage, follow mode and
nightly runs. The model server that serves a checkpoint is ``serve``."""
