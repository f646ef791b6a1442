"""The lab's measurements of RidgeFill against the exact model: ΔNLL, TTFT, the selection hit rate, sweeps,
sources, follow-ups, fidelity and their reports. They build on what the product runs itself: backend/recall/
(needles, haystacks, the recall run; the GUI's recall panel) and backend/tuning/ (Tune for this model)."""
