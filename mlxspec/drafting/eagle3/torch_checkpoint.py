"""PyTorch's zip checkpoints (`pytorch_model.bin`, as SafeAILab ships EAGLE heads) read without torch and without
running pickled code.

A torch zip holds `<name>/data.pkl`, a pickle of the state dict whose tensors are `torch._utils._rebuild_tensor_v2`
calls over storages kept as separate zip entries (`<name>/data/<key>`). The unpickler here resolves only the names
such a state dict needs (OrderedDict, the tensor and parameter rebuilders, the typed storage classes) to inert
stand-ins, so nothing in the file can run: any other global is refused by name.
"""

from __future__ import annotations

import collections
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


def _rebuild_tensor(storage: StorageRef, offset: int, size: tuple, stride: tuple, *_ignored: Any) -> TensorRef:
    return TensorRef(storage, int(offset), tuple(int(s) for s in size), tuple(int(s) for s in stride))


def _rebuild_parameter(data: TensorRef, *_ignored: Any) -> TensorRef:
    return data


ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


class StateDictUnpickler(pickle.Unpickler):
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


def _array(ref: TensorRef, raw: bytes) -> mx.array:
    dtype = "uint16" if ref.storage.dtype == "bfloat16" else ref.storage.dtype
    flat = np.frombuffer(raw, dtype=np.dtype(dtype))
    count = int(np.prod(ref.size)) if ref.size else 1
    if count and ref.offset + sum((n - 1) * s for n, s in zip(ref.size, ref.stride)) >= flat.size:
        raise ValueError("a tensor reaches past its storage")
    item = flat.itemsize
    view = np.lib.stride_tricks.as_strided(
        flat[ref.offset :], shape=ref.size, strides=tuple(s * item for s in ref.stride)
    )
    array = mx.array(np.ascontiguousarray(view))
    return array.view(mx.bfloat16) if ref.storage.dtype == "bfloat16" else array


def load_torch_state_dict(path: Path) -> dict[str, mx.array]:
    """The tensors of a torch zip checkpoint as MLX arrays; anything else is refused in one line."""
    if not zipfile.is_zipfile(path):
        raise UserError(
            f"'{path}' is a legacy (pre-zip) torch file, which mlxspec does not read; {conversion_hint(path)}"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            if len(pickles) != 1:
                raise ValueError("no single data.pkl")
            prefix = pickles[0][: -len("data.pkl")]
            state = StateDictUnpickler(archive.open(pickles[0])).load()
            if not isinstance(state, dict) or not all(isinstance(v, TensorRef) for v in state.values()):
                raise ValueError("not a flat state dict of tensors")
            storages: dict[str, bytes] = {}
            tensors = {}
            for name, ref in state.items():
                if ref.storage.key not in storages:
                    storages[ref.storage.key] = archive.read(f"{prefix}data/{ref.storage.key}")
                tensors[str(name)] = _array(ref, storages[ref.storage.key])
            return tensors
    except (pickle.UnpicklingError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise UserError(
            f"'{path}' is not a plain torch state dict mlxspec can read ({error}); {conversion_hint(path)}"
        ) from None
