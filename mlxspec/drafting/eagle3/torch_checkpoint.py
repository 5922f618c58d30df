"""PyTorch's zip checkpoints (`pytorch_model.bin`, as SafeAILab ships EAGLE heads) read without torch and without
running pickled code.

A torch zip holds `<name>/data.pkl`, a pickle of the state dict whose tensors are `torch._utils._rebuild_tensor_v2`
calls over storages kept as separate zip entries (`<name>/data/<key>`). The unpickler here resolves only the names
such a state dict needs (OrderedDict, the tensor and parameter rebuilders, the typed storage classes) to inert
stand-ins, so nothing in the file can run: any other global is refused by name.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

import mlx.core as mx
import numpy as np

from mlxspec.errors import UserError

STORAGE_DTYPES = {
    "HalfStorage": "float16",
    "FloatStorage": "float32",
    "BFloat16Storage": "bfloat16",
    "DoubleStorage": "float64",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
}


def conversion_hint(path: Path) -> str:
    return (
        f'convert it once where torch is installed: python -c "import torch; from safetensors.torch import '
        f"save_file; save_file(torch.load('{path}'), '{path.with_name('model.safetensors')}')\""
    )


MAX_DIMS = 16
MAX_PICKLE_BYTES = 64 << 20  # a state dict's pickle names its tensors; weights live in the storages
MAX_INFLATION = 64  # uncompressed bytes per stored byte: weights barely compress, a zip bomb inflates ~1000x


class StorageType(NamedTuple):
    dtype: str


class StorageRef(NamedTuple):
    dtype: str
    key: str


class TensorRef(NamedTuple):
    storage: StorageRef
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_ignored: Any) -> TensorRef:
    """A tensor as a reference to its storage, its fields checked before anything is read: a hostile file may put
    any value in any field."""
    if not isinstance(storage, StorageRef):
        raise ValueError(f"a tensor's storage is {type(storage).__name__}, not a storage")
    if not _is_count(offset):
        raise ValueError(f"a tensor's storage offset is {offset!r}, not an integer >= 0")
    shaped = isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride) <= MAX_DIMS
    if not shaped or not all(_is_count(n) for n in size + stride):
        raise ValueError(f"a tensor's size {size!r} or stride {stride!r} is not a tuple of integers >= 0")
    return TensorRef(storage, offset, size, stride)


def _rebuild_parameter(data: TensorRef, *_ignored: Any) -> TensorRef:
    return data


ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


class StateDictUnpickler(pickle._Unpickler):
    """Python's own unpickler, not the C one: a length field of a hostile opcode (BINBYTES8 of 2^62) makes the C
    unpickler allocate that many bytes before reading; this one reads what is there and fails on the short read."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED:
            return ALLOWED[(module, name)]
        if module == "torch" and name in STORAGE_DTYPES:
            return StorageType(STORAGE_DTYPES[name])
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a plain state dict")

    def persistent_load(self, pid: Any) -> StorageRef:
        if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage" and isinstance(pid[1], StorageType)):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        return StorageRef(pid[1].dtype, str(pid[2]))


def _itemsize(ref: TensorRef) -> int:
    return np.dtype("uint16" if ref.storage.dtype == "bfloat16" else ref.storage.dtype).itemsize


def _extent(ref: TensorRef) -> int:
    """Elements of its storage a tensor reaches, from the start: 0 for an empty tensor."""
    if any(n == 0 for n in ref.size):
        return 0
    return ref.offset + 1 + sum((n - 1) * s for n, s in zip(ref.size, ref.stride))


def _storage_bytes(archive: zipfile.ZipFile, entry: str, refs: list[TensorRef]) -> bytes:
    """The bytes of one storage its tensors need, checked against what the zip entry declares before any read: a
    tensor must lie inside its storage and claim no more elements than it holds (a stride of 0 could otherwise make
    a few bytes claim terabytes), and the entry must not inflate like a zip bomb."""
    info = archive.getinfo(entry)
    item = _itemsize(refs[0])
    if any(r.storage.dtype != refs[0].storage.dtype for r in refs):
        raise ValueError(f"storage {entry} is named with two dtypes")
    held = info.file_size // item
    for ref in refs:
        count = int(np.prod(ref.size, dtype=object)) if ref.size else 1
        if count > held or _extent(ref) > held:
            raise ValueError(f"a tensor of size {ref.size} reaches past its storage of {held} elements")
    if info.compress_type != zipfile.ZIP_STORED and info.file_size > MAX_INFLATION * max(1, info.compress_size) + (
        1 << 20
    ):
        raise ValueError(f"storage {entry} inflates {info.file_size} bytes from {info.compress_size} (a zip bomb?)")
    needed = max(_extent(r) for r in refs) * item
    with archive.open(info) as stream:
        raw = stream.read(needed)
    if len(raw) < needed:
        raise ValueError(f"storage {entry} holds {len(raw)} bytes, not the {needed} its tensors need")
    return raw


def _array(ref: TensorRef, raw: bytes) -> mx.array:
    """One tensor from its storage's bytes; _storage_bytes checked that the view lies inside them."""
    dtype = "uint16" if ref.storage.dtype == "bfloat16" else ref.storage.dtype
    flat = np.frombuffer(raw, dtype=np.dtype(dtype))
    if not _extent(ref):
        array = mx.array(np.zeros(ref.size, dtype=flat.dtype))
    else:
        item = flat.itemsize
        view = np.lib.stride_tricks.as_strided(
            flat[ref.offset :], shape=ref.size, strides=tuple(s * item for s in ref.stride)
        )
        array = mx.array(np.array(view))  # a copy, of any rank (ascontiguousarray makes a scalar [1])
    return array.view(mx.bfloat16) if ref.storage.dtype == "bfloat16" else array


def _read_state(archive: zipfile.ZipFile) -> dict[str, mx.array]:
    pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
    if len(pickles) != 1:
        raise ValueError("no single data.pkl")
    prefix = pickles[0][: -len("data.pkl")]
    if archive.getinfo(pickles[0]).file_size > MAX_PICKLE_BYTES:
        raise ValueError(f"its data.pkl is over {MAX_PICKLE_BYTES >> 20} MiB")
    with archive.open(pickles[0]) as stream:
        state = StateDictUnpickler(io.BytesIO(stream.read(MAX_PICKLE_BYTES + 1))).load()
    # The exact types, read through dict's own methods: a BUILD opcode can shadow an instance's `items`.
    if type(state) not in (dict, collections.OrderedDict):
        raise ValueError(f"it holds a {type(state).__name__}, not a state dict")
    items = list(dict.items(state))
    if not all(type(name) is str and type(ref) is TensorRef for name, ref in items):
        raise ValueError("not a flat state dict of named tensors")
    by_storage: dict[str, list[TensorRef]] = {}
    for _, ref in items:
        by_storage.setdefault(ref.storage.key, []).append(ref)
    storages = {key: _storage_bytes(archive, f"{prefix}data/{key}", refs) for key, refs in by_storage.items()}
    return {name: _array(ref, storages[ref.storage.key]) for name, ref in items}


def load_torch_state_dict(path: Path) -> dict[str, mx.array]:
    """The tensors of a torch zip checkpoint as MLX arrays; anything else is refused in one line."""
    if not zipfile.is_zipfile(path):
        raise UserError(
            f"'{path}' is a legacy (pre-zip) torch file, which mlxspec does not read; {conversion_hint(path)}"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            return _read_state(archive)
    except UserError:
        raise
    except Exception as error:  # any failure on a hostile or damaged file is one line naming it
        reason = str(error) if isinstance(error, (ValueError, pickle.UnpicklingError)) else type(error).__name__
        raise UserError(
            f"'{path}' is not a plain torch state dict mlxspec can read ({reason[:200]}); {conversion_hint(path)}"
        ) from None
