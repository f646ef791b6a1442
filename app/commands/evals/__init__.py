"""Lab tooling, not the product: the eval commands (recall, compare, nll, sweep, bench, hitrate, followup)
that measure RidgeFill against the exact model. Their measurement code is backend/evals/."""
