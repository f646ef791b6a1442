"""One-off experiments kept so that a figure of docs/MEASUREMENTS.md can be made again (README.md here):
`python -m lab.experiments.NAME ...` from a checkout. Not part of the tests."""
