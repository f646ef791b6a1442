"""Needle recall, exact against RidgeFill on the same items: haystacks, needles, questions about real
documents, the run and its scoring and statistics. The product runs it (the GUI's recall panel,
app/recall_task.py, and Tune, backend/tuning/); the lab's measurements (lab/evals/) build on it."""
