"""The memory planner: will a target and its drafter fit a device. Imports neither MLX nor decoding."""
