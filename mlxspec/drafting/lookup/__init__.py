"""Model-free drafts: prompt lookup, the n-gram table, the suffix index and the corpus they read."""
