"""The command line: a lazy dispatcher (main.py) and one module per command; MLX is imported only when needed."""
