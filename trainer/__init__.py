"""The trainer: DeepSpeed training on versioned datasets, checkpoints with lineage, and the
reference upstream that serves a checkpoint (``trainer.serve``)."""
