"""One run on disk and on the machine (directory, lock, metrics, checkpoints, device, precision, random streams,
torchrun's processes) and loading a model for inference: below every script, which all call it."""
