"""Training mechanics that train.py calls: the step, schedules, optimizers, budget, evaluation, logging."""
