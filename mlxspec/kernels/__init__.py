"""Verify kernels: matmuls for 1-16 rows behind the VerifyBackend protocol (the CPU extension today)."""
