"""Serving: the OpenAI-compatible HTTP server, its wire format, and the terminal chat."""
