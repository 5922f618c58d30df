"""mlxspec: exact speculative decoding on MLX."""

from .api import Chunk, GenerationResult, Speculator, Stats, generate, load
from .errors import UserError
from .sampling import SamplingConfig

__all__ = ["Chunk", "GenerationResult", "SamplingConfig", "Speculator", "Stats", "UserError", "generate", "load"]
__version__ = "0.1.0"
