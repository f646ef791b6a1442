"""Tune for this model (`python -m app tune`, the GUI's Tune): the split chosen by measuring recall
(backend/recall/) and speed on this machine; its items (items.py) and the run (tune.py)."""
