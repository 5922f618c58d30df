"""mlxspec: exact speculative decoding on MLX.

Names are imported lazily so that `mlxspec plan` and `--help` never pay for importing MLX and mlx-lm.
"""

from importlib import import_module

__version__ = "0.1.0"
_EXPORTS = {
    "Chunk": "results",
    "DecodeOptions": "options",
    "SlowBLASWarning": "api",
    "GenerationResult": "results",
    "Speculator": "api",
    "Stats": "results",
    "generate": "api",
    "load": "api",
    "UserError": "errors",
    "SamplingConfig": "options",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'mlxspec' has no attribute {name!r}")
