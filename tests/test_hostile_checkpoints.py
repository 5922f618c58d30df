"""A hostile `pytorch_model.bin` (issue 36, rows 1, 2, 4 and 5): negative or zero strides, negative offsets, sizes
past the storage, zip bombs and pickles that call an allowed name wrongly are each refused in one line naming the
file. A seeded fuzz of strides, offsets, sizes and pickle bytes never crashes and never reads outside a storage."""

from __future__ import annotations

import collections
import io
import pickle
import random
import struct
import zipfile

import numpy as np
import pytest
from tiny_eagle3 import TORCH_STORAGE, _Global, _Storage, _TorchPickler, write_torch_zip

from mlxspec.drafting.eagle3.torch_checkpoint import load_torch_state_dict
from mlxspec.errors import UserError

STORAGE = np.arange(64, dtype=np.float32)  # every element names its own index, so a read shows where it came from


class _View:
    """A tensor whose fields are written as given, however wrong."""

    def __init__(self, storage, offset, size, stride):
        self.fields = (storage, offset, size, stride)

    def __reduce__(self):
        return _Global("torch._utils", "_rebuild_tensor_v2"), (*self.fields, False, collections.OrderedDict())


def pickled(state) -> bytes:
    buffer = io.BytesIO()
    _TorchPickler(buffer, protocol=2).dump(state)
    return buffer.getvalue()


def write_zip(path, data_pkl: bytes, storages: dict[str, bytes], method: int = zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=method) as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        for key, blob in storages.items():
            archive.writestr(f"archive/data/{key}", blob)
    return path


def one_view(tmp_path, offset, size, stride, storage_key="0", numel=STORAGE.size):
    storage = _Storage(storage_key, "float32", numel)
    data = pickled(collections.OrderedDict(w=_View(storage, offset, size, stride)))
    return write_zip(tmp_path / "pytorch_model.bin", data, {"0": STORAGE.tobytes()})


def refused(path) -> str:
    with pytest.raises(UserError) as error:
        load_torch_state_dict(path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message
    return message


@pytest.mark.parametrize(
    "offset, size, stride",
    [
        (0, (4,), (-1,)),  # a negative stride walks below the buffer
        (0, (2,), (-(2**40),)),
        (-1, (4,), (1,)),  # a negative offset read 2 MiB before the buffer
        (60, (8,), (1,)),  # past the end
        (0, (2**20, 2**12), (0, 0)),  # zero strides: 4G elements claimed from 64
        (0, (10**13,), (0,)),
        (0, (2,), (2**62,)),
    ],
)
def test_a_view_outside_its_storage_is_refused_before_any_allocation(tmp_path, offset, size, stride):
    message = refused(one_view(tmp_path, offset, size, stride))
    assert "storage" in message or ">= 0" in message


def raw_pickle(*opcodes: bytes) -> bytes:
    return b"\x80\x02" + b"".join(opcodes) + b"."


GLOBAL_DICT = b"ccollections\nOrderedDict\n"
REBUILD = b"ctorch._utils\n_rebuild_tensor_v2\n"


@pytest.mark.parametrize(
    "data",
    [
        raw_pickle(b"ctorch\nHalfStorage\n", b")", b"R"),  # HalfStorage() called
        raw_pickle(GLOBAL_DICT, b"K\x01\x85", b"R"),  # OrderedDict(1)
        raw_pickle(b"\x8e" + struct.pack("<Q", 2**62) + b"abc"),  # BINBYTES8 of 2^62
        raw_pickle(GLOBAL_DICT, b")R", b"}X\x06\x00\x00\x00valuesK\x01s", b"b"),  # BUILD shadowing .values
        raw_pickle(
            REBUILD, b"(X\x01\x00\x00\x00sK\x00K\x04\x85K\x01\x85\x89", GLOBAL_DICT, b")Rt", b"R"
        ),  # str storage
        raw_pickle(b"K\x05"),  # a bare int
        raw_pickle(b"]", b"X\x01\x00\x00\x00a", b"a"),  # a list
        b"\x80\x02(",  # truncated
    ],
    ids=["HalfStorage()", "OrderedDict(1)", "BINBYTES8", "BUILD-values", "str-storage", "int", "list", "truncated"],
)
def test_a_pickle_calling_an_allowed_name_wrongly_is_one_line(tmp_path, data):
    path = write_zip(tmp_path / "pytorch_model.bin", data, {"0": STORAGE.tobytes()})
    try:
        result = load_torch_state_dict(path)
    except UserError as error:
        assert "\n" not in str(error) and str(path) in str(error)
        return
    assert result == {}  # an empty state dict is read as one (the loader then names the missing weights)


def test_fields_of_the_wrong_type_are_refused(tmp_path):
    storage = _Storage("0", "float32", 64)
    cases = [(storage, 0, 4, (1,)), (storage, [0], (4,), (1,)), ("0", 0, (4,), (1,)), (storage, 0, (4.0,), (1,))]
    for i, fields in enumerate(cases):
        folder = tmp_path / str(i)
        folder.mkdir()
        data = pickled(collections.OrderedDict(w=_View(*fields)))
        refused(write_zip(folder / "pytorch_model.bin", data, {"0": STORAGE.tobytes()}))


def test_a_zip_bomb_storage_is_refused_without_inflating_it(tmp_path):
    bomb = b"\0" * (256 << 20)  # 256 MiB of zeros deflate to about 256 KiB
    storage = _Storage("0", "float32", len(bomb) // 4)
    data = pickled(collections.OrderedDict(w=_View(storage, 0, (len(bomb) // 4,), (1,))))
    path = write_zip(tmp_path / "pytorch_model.bin", data, {"0": bomb}, method=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 2 << 20
    assert "zip bomb" in refused(path)


def test_a_zip_entry_of_an_unknown_method_is_one_line(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    write_torch_zip(path, {"w": np.ones(4, np.float32)})
    raw = bytearray(path.read_bytes())
    for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):  # compression method in both headers
        start = 0
        while (start := raw.find(signature, start)) >= 0:
            raw[start + offset : start + offset + 2] = struct.pack("<H", 99)
            start += 4
    path.write_bytes(bytes(raw))
    refused(path)


def test_a_storage_larger_than_its_view_reads_only_what_the_view_needs(tmp_path):
    """torch saves a slice with its whole storage: the view's elements come out, from the right place."""
    path = one_view(tmp_path, 10, (2, 3), (5, 2))
    (read,) = load_torch_state_dict(path).values()
    expected = STORAGE[10:][np.array([[0, 2, 4], [5, 7, 9]])]
    assert np.array_equal(np.array(read), expected)


def test_fuzzed_views_and_pickles_never_crash_or_read_outside_the_storage(tmp_path):
    """Seeded: 300 random views (strides, offsets and sizes, negative ones included) and 200 pickles with random
    bytes changed. Each read returns exactly the elements its view names inside the storage, or one UserError."""
    rng = random.Random(36)
    read_ok = refused_count = 0
    for case in range(300):
        dims = rng.randint(0, 3)
        size = tuple(rng.choice([0, 1, 2, 3, 7, 2**31, -1]) for _ in range(dims))
        stride = tuple(rng.choice([0, 1, 2, 5, 64, -1, 2**40]) for _ in range(dims))
        offset = rng.choice([0, 1, 13, 63, 64, -1, 2**62])
        folder = tmp_path / f"v{case}"
        folder.mkdir()
        try:
            (read,) = load_torch_state_dict(one_view(folder, offset, size, stride)).values()
        except UserError:
            refused_count += 1
            continue
        read_ok += 1
        if 0 in size:
            assert np.array(read).shape == size
            continue
        index = np.full(size, offset, dtype=np.int64)
        for axis, step in enumerate(stride):
            shape = [1] * len(size)
            shape[axis] = size[axis]
            index = index + (np.arange(size[axis]) * step).reshape(shape)
        assert index.size == 0 or (0 <= index.min() and index.max() < STORAGE.size)
        assert np.array_equal(np.array(read), STORAGE[index])
    assert read_ok > 20 and refused_count > 20  # both sides were reached
    good = pickled(collections.OrderedDict(w=_View(_Storage("0", "float32", 64), 0, (8,), (1,))))
    for case in range(200):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(2, len(data))] = rng.randrange(256)
        path = write_zip(tmp_path / f"p{case}.bin", bytes(data), {"0": STORAGE.tobytes()})
        try:
            for value in load_torch_state_dict(path).values():
                assert np.isin(np.array(value), STORAGE).all()
        except UserError as error:
            assert "\n" not in str(error)


def test_storage_names_are_looked_up_in_the_zip_only(tmp_path):
    """A storage key like '../../etc/passwd' names a zip entry that does not exist; nothing outside is opened."""
    storage = _Storage("../../../etc/passwd", "float32", 4)
    data = pickled(collections.OrderedDict(w=_View(storage, 0, (4,), (1,))))
    refused(write_zip(tmp_path / "pytorch_model.bin", data, {"0": STORAGE.tobytes()}))


assert "float32" in TORCH_STORAGE and pickle.HIGHEST_PROTOCOL >= 2
