"""What report.py needs to compare the runs of an ablation: statistics, decode speed, plots."""
