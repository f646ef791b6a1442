"""The server's load test (`python -m lab serve-load`, lab/commands/serve_load.py): load.py, a bounded load
test against a running server and the added-latency measurement; hostile.py, its hostile clients."""
