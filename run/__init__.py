"""One run on disk and on the machine: its directory, lock and metrics, checkpoints, device,
precision and random streams, the processes of a torchrun, and loading a model for inference.
Below every script: train.py, sample.py, evaluation/, export.py, ablation/ and bench/ call it."""
