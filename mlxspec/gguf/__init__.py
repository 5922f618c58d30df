"""GGUF files as users hold them (llama.cpp, Ollama, LM Studio): the header read without MLX (header.py), and the
conversion, once, into an mlx-lm model directory under mlxspec's cache (convert.py)."""
