"""Lab tooling: measuring RidgeFill against the exact model (needle recall, ΔNLL, TTFT, selection hit
rate, sweeps, reports); the CLI's eval commands are app/commands/evals/. The product runs two of these
itself: Tune for this model (tune.py) and the GUI's recall panel (recall.py, via app/recall_task.py)."""
