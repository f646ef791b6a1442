"""The lab beside the product: what only measures RidgeFill (the eval commands, the fuzzers, a load test, the
experiments) and is never shipped. It imports app and backend; app, backend and ui never import it (an
import contract in pyproject.toml), and the bundle leaves it out (packaging/ridgefill.spec).

- lab/cli.py, `python -m lab COMMAND`: the commands (lab/commands/);
- lab/evals/: their measurement code (ΔNLL, TTFT, hit rate, sweeps, sources, fidelity, reports), on top of
  what the product runs itself: backend/recall/ (the GUI's recall panel) and backend/tuning/ (Tune);
- lab/server_load/: the server's load test and its hostile clients (`serve-load`);
- lab/experiments/: one-off scripts kept so that a figure of docs/MEASUREMENTS.md can be made again."""
