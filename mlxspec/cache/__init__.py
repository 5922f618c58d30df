"""Caches that roll back: trimmed attention caches and snapshotted recurrent layers."""
