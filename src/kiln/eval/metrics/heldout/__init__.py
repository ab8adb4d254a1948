"""Held-out loss, perplexity and bits per byte of the final model, per source and over the kept
checkpoints, beside a unigram model of the same data."""
