"""The core: the speculative step (draft, verify in one target forward, accept, roll back). Imports no wing."""
