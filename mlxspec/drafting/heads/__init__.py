"""Heads on the target: Medusa, Hydra, the EAGLE feature head and its drafter, MTP weights, head files."""
