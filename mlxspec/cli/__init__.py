"""The command line: a lazy dispatcher (main.py) and one module per command. Imports MLX only when a command needs it."""
