"""Verify kernels: matmuls for 1-32 rows behind the VerifyBackend protocol (the CPU extension today)."""
