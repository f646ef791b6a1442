"""The lab's commands (`python -m lab COMMAND`, lab/cli.py): the evals (recall, compare, nll, sweep, bench,
hitrate, followup, sources, fidelity), the fuzzers (fuzz-readers, fuzz-server), the server's load test
(serve-load) and the prompt cache's bench (cache bench). Their measurement code is lab/evals/."""
