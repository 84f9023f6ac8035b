"""Training mechanics that train.py and sample.py call: checkpoints, schedules, runtime, logging."""
