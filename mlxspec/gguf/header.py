"""A GGUF file's header: its metadata and its tensors' names, shapes and types, read without MLX and without
touching the weights (`mlxspec plan` reads this alone).

The format (ggml's docs/gguf.md): magic "GGUF", version, tensor count, metadata count; each metadata entry a
string key, a value type and a value (arrays carry an element type and a count); then each tensor's name, shape
(innermost first), type and offset into the data section, which starts at the next multiple of the alignment.
Every length read is checked against the file's size before anything is allocated: the file may be hostile.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from mlxspec.errors import UserError

MAGIC = b"GGUF"
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
# ggml types: name, elements per block, bytes per block (gguf-py's GGML_QUANT_SIZES, for the types users meet).
TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4),
    27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
}  # fmt: skip
MAX_DIMS = 8


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # as numpy sees it: outermost first (GGUF stores innermost first)
    type_id: int
    offset: int  # from the start of the data section

    @property
    def type_name(self) -> str:
        return TYPES[self.type_id][0]

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        _, block, size = TYPES[self.type_id]
        return self.count // block * size


@dataclass
class Header:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo] = field(default_factory=list)
    data_start: int = 0

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch(self, key: str, default: Any = None) -> Any:
        """A metadata value under the architecture's own prefix (gemma3.block_count, ...)."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


class _Reader:
    def __init__(self, stream: BinaryIO, size: int, path: Path, strings_of: set[str]):
        self.stream, self.size, self.path, self.strings_of = stream, size, path, strings_of

    def bad(self, what: str) -> UserError:
        return UserError(f"'{self.path}' is not a readable GGUF file ({what}); is the download complete?")

    def take(self, n: int) -> bytes:
        if n < 0 or self.stream.tell() + n > self.size:
            raise self.bad(f"a field of {n} bytes runs past the end of the file")
        return self.stream.read(n)

    def scalar(self, kind: int) -> Any:
        fmt = SCALARS[kind]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.scalar(10)).decode("utf-8", errors="replace")

    def value(self, kind: int, key: str) -> Any:
        if kind in SCALARS:
            return self.scalar(kind)
        if kind == STRING:
            return self.string()
        if kind != ARRAY:
            raise self.bad(f"metadata '{key}' has an unknown type {kind}")
        element, count = self.scalar(4), self.scalar(10)
        if element in SCALARS:
            width = struct.calcsize(SCALARS[element])
            raw = self.take(width * count)
            return list(struct.unpack(f"<{count}{SCALARS[element][1]}", raw)) if key in self.strings_of else count
        if element == STRING and key in self.strings_of:
            return [self.string() for _ in range(count)]
        if element == STRING:  # skipped unread: a 262k-token vocabulary is not the header's business
            for _ in range(count):
                self.take(self.scalar(10))
            return count
        raise self.bad(f"metadata '{key}' is an array of type {element}")


def read_header(path: Path, arrays: tuple[str, ...] = ()) -> Header:
    """The header of the GGUF file at `path`; arrays are given as their length, except those named in `arrays`
    (e.g. "tokenizer.ggml.tokens"), which are read whole."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as stream:
            return _read(_Reader(stream, size, path, set(arrays)))
    except OSError as error:
        raise UserError(f"cannot read '{path}': {error.strerror}") from None


def _read(r: _Reader) -> Header:
    if r.take(4) != MAGIC:
        raise r.bad("it does not start with GGUF")
    version = r.scalar(4)
    if version not in (2, 3):
        raise r.bad(f"GGUF version {version}; mlxspec reads versions 2 and 3")
    tensor_count, kv_count = r.scalar(10), r.scalar(10)
    if tensor_count > r.size // 24 or kv_count > r.size // 12:
        raise r.bad(f"it claims {tensor_count} tensors and {kv_count} metadata entries")
    metadata = {}
    for _ in range(kv_count):
        key = r.string()
        metadata[key] = r.value(r.scalar(4), key)
    tensors = []
    for _ in range(tensor_count):
        name, dims = r.string(), r.scalar(4)
        if dims > MAX_DIMS:
            raise r.bad(f"tensor '{name}' has {dims} dimensions")
        shape = tuple(r.scalar(10) for _ in range(dims))[::-1]
        type_id, offset = r.scalar(4), r.scalar(10)
        if type_id not in TYPES:
            raise r.bad(f"tensor '{name}' has an unknown type {type_id}")
        tensors.append(TensorInfo(name, shape, type_id, offset))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or not 1 <= alignment <= 1 << 20:
        raise r.bad(f"general.alignment is {alignment!r}")
    data_start = -(-r.stream.tell() // alignment) * alignment
    for tensor in tensors:
        _, block, _ = TYPES[tensor.type_id]
        if tensor.count % block or data_start + tensor.offset + tensor.nbytes > r.size:
            raise r.bad(f"tensor '{tensor.name}' runs past the end of the file")
    return Header(r.path, version, metadata, tensors, data_start)
