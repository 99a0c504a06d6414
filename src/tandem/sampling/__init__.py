"""Token picking: probability filters, seeded noise, and the rank-side speculative rule."""
