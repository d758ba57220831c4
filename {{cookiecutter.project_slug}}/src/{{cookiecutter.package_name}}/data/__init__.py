"""Data: batches as a function of the step, token shards, tokenizers, input prefetch."""
