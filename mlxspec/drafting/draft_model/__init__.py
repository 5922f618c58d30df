"""Draft models: the drafter, its compiled chain and batched rows."""
