"""The fast ``torch.save`` reader gives exactly what ``torch.load(weights_only=True)`` gives,
and refuses (through ``torch.load``) everything it does not know."""

from __future__ import annotations

import io
import os
import pickle
import warnings
from collections import OrderedDict

import pytest
import torch

from shardsmith.loaders.pth_fast import NotFast, load_fast, load_pth_bytes


def saved(obj, **kw) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kw)
    return buf.getvalue()


def same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(a, b) if a.dtype != torch.bool else bool((a == b).all())
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    else:
        assert a == b


g = torch.Generator().manual_seed(0)
CASES = {
    "float32 latent": torch.randn(4, 32, 32, generator=g),
    "bfloat16 text embedding": torch.randn(77, 64, generator=g).to(torch.bfloat16),
    "float16": torch.randn(3, 5, generator=g).half(),
    "int64 mask": torch.ones(128, dtype=torch.int64),
    "bool": torch.rand(7, generator=g) > 0.5,
    "uint8 frames": torch.randint(0, 255, (2, 3, 4, 4), dtype=torch.uint8, generator=g),
    "scalar": torch.tensor(3.5),
    "empty": torch.empty(0, 4),
    "transposed view": torch.randn(6, 4, generator=g).t(),
    "dict like .precomputed": {"latents": torch.randn(8, 2, 4, 4, generator=g).to(torch.bfloat16), "num_frames": 9,
                               "height": 64, "width": 96, "fps": 24.0},
    "nested list/tuple": [torch.arange(5), (torch.zeros(2), "text", None, 1.5), {"a": [1, 2]}],
    "ordered dict": OrderedDict(b=torch.ones(2), a=torch.zeros(3)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fast_path_equals_torch_load(name):
    data = saved(CASES[name])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. torch.frombuffer on a read-only buffer
        got = load_fast(data)
    same(got, torch.load(io.BytesIO(data), weights_only=True))


def test_views_keep_sharing_one_storage_and_own_writable_memory():
    base = torch.arange(12.0)
    data = saved({"a": base[:6], "b": base[6:].view(2, 3)})
    got = load_fast(data)
    assert got["a"].untyped_storage().data_ptr() == got["b"].untyped_storage().data_ptr()
    assert got["b"].tolist() == [[6.0, 7.0, 8.0], [9.0, 10.0, 11.0]]
    got["a"][0] = 100.0  # writable, and the caller's bytes are untouched
    assert load_fast(data)["a"][0] == 0.0


def test_handed_over_memory_is_used_in_place_and_read_only_memory_is_copied(tmp_path):
    """The loader reads ``.pth`` members into fresh writable memory (``read_member(writable=True)``)
    and hands it over: the tensor uses it without a copy. Read-only bytes are copied first."""
    import numpy as np

    from shardsmith.loaders.shard_reader import read_member

    want = torch.randn(4, 8, 8, generator=g)
    data = saved(want)
    path = tmp_path / "m.bin"
    path.write_bytes(b"x" * 100 + data)
    fd = os.open(path, os.O_RDONLY)
    try:
        mem = read_member(fd, (100, len(data)), writable=True)
    finally:
        os.close(fd)
    assert isinstance(mem, memoryview) and not mem.readonly and bytes(mem) == data
    lo = np.frombuffer(mem, np.uint8).ctypes.data
    for _ in range(2):  # the second load takes the cached plan (same pickle as the first)
        got = load_fast(mem)
        same(got, want)
        assert lo <= got.data_ptr() < lo + len(data)  # in the handed-over memory: no copy
    ro = memoryview(data)
    got = load_fast(ro)
    same(got, want)
    got[0, 0, 0] = 1e6  # writable all the same: it owns a copy
    assert load_fast(data)[0, 0, 0] == want[0, 0, 0]


def test_a_tensor_with_requires_grad_goes_through_torch_load():
    data = saved(torch.ones(3, requires_grad=True))
    with pytest.raises(NotFast):
        load_fast(data)
    assert load_pth_bytes(data).requires_grad


def test_legacy_format_falls_back_to_torch_load():
    data = saved({"x": torch.arange(4)}, _use_new_zipfile_serialization=False)
    with pytest.raises(NotFast):
        load_fast(data)
    assert load_pth_bytes(data)["x"].tolist() == [0, 1, 2, 3]


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/shardsmith-pwned",))


def test_malicious_pickle_is_refused_not_executed(tmp_path):
    marker = "/tmp/shardsmith-pwned"
    if os.path.exists(marker):
        os.remove(marker)
    data = saved({"latent": torch.zeros(2), "payload": Evil()})
    with pytest.raises(NotFast, match="posix.system|os.system"):
        load_fast(data)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_pth_bytes(data)
    assert not os.path.exists(marker)


def test_truncated_bytes_raise_torch_loads_error():
    data = saved(torch.randn(64, 64))
    with pytest.raises(Exception) as e1:
        load_pth_bytes(data[: len(data) // 2])
    with pytest.raises(Exception) as e2:
        torch.load(io.BytesIO(data[: len(data) // 2]), weights_only=True)
    assert type(e1.value) is type(e2.value)


def test_a_missing_or_short_storage_record_is_not_trusted():
    data = saved(torch.arange(16, dtype=torch.int32))
    # rename the storage record (local header and central directory): the pickle's key "0" is gone
    renamed = data.replace(b"archive/data/0", b"archive/data/9")
    with pytest.raises(NotFast, match="storage size mismatch"):
        load_fast(renamed)
    with pytest.raises(Exception):
        torch.load(io.BytesIO(renamed), weights_only=True)
    with pytest.raises(Exception):
        load_pth_bytes(renamed)


def test_a_bytearray_is_used_in_place_and_bytes_are_copied():
    data = saved(torch.arange(8, dtype=torch.int16))
    owned = bytearray(data)
    t = load_fast(owned)
    t[0] = 7
    assert owned != bytearray(data)  # the tensor lives in the caller's bytearray
    assert load_fast(bytes(owned))[0] == 7 and load_fast(data)[0] == 0


@pytest.mark.parametrize("name", ["float32 latent", "bfloat16 text embedding", "transposed view", "scalar", "empty"])
def test_repeated_pickles_use_the_cached_plan_and_still_equal_torch_load(name):
    from shardsmith.loaders import pth_fast

    like = CASES[name]
    gen = torch.Generator().manual_seed(1)
    first = saved(like)
    load_fast(first)
    pickled_plans = len(pth_fast._PLANS)
    for i in range(20):  # same shape, dtype and strides, different values: byte-identical pickles
        t = (torch.randn(like.shape if name != "transposed view" else like.t().shape, generator=gen) * i)
        t = (t.t() if name == "transposed view" else t).to(like.dtype)
        data = saved(t)
        got = load_fast(bytearray(data))
        same(got, torch.load(io.BytesIO(data), weights_only=True))
    assert len(pth_fast._PLANS) == pickled_plans  # no new plan: every later member took the cached one
    # a member with the same pickle but a short storage record is still refused, then torch.load decides
    short = first.replace(b"archive/data/0", b"archive/data/7")
    with pytest.raises(NotFast, match="storage size mismatch"):
        load_fast(short)


def test_a_cached_directory_is_used_only_when_it_is_the_same_directory(tmp_path):
    """Members of one length share a cached central directory only when theirs is byte-equal to
    it but for the CRC32s: then every result still equals torch.load's; a member whose directory
    differs (other record names, a damaged entry) is walked, and fails as it did without the cache."""
    from shardsmith.loaders import pth_fast

    gen = torch.Generator().manual_seed(2)
    members = [saved(torch.randn(4, 8, 8, generator=gen)) for _ in range(6)]
    assert len({len(m) for m in members}) == 1
    pth_fast._LAYOUTS.clear()
    for m in members:
        same(load_fast(m), torch.load(io.BytesIO(m), weights_only=True))
    assert len(pth_fast._LAYOUTS) == 1  # one length, one directory: the later members compared, not walked

    # same length, other record names (torch.save to a path names the records after the file)
    (tmp_path / "latentX.pth").write_bytes(b"")
    torch.save(torch.randn(4, 8, 8, generator=gen), tmp_path / "latentX.pth")
    other = (tmp_path / "latentX.pth").read_bytes()
    if len(other) == len(members[0]):
        assert pth_fast._LAYOUTS[len(other)][3] != pth_fast._Zip(memoryview(other)).entries
    same(load_fast(other), torch.load(io.BytesIO(other), weights_only=True))

    # same length, a damaged directory entry (its record size): walked, and refused as before
    rec = pth_fast.central_directory(members[1])[0]
    cd_off = pth_fast.central_directory(members[1])[1]
    bad = bytearray(members[1])
    size_pos = rec[-1].cd_crc_pos + 4  # compressed size of the last record
    bad[size_pos] ^= 0x01
    bad = bytes(bad)
    assert len(bad) == len(members[0]) and bad[cd_off:] != members[1][cd_off:]
    pth_fast._LAYOUTS.clear()
    try:
        uncached = load_fast(bad)
    except Exception as exc:  # noqa: BLE001 - compare with the cached run below
        uncached = type(exc)
    load_fast(members[0])  # the cache now holds the good directory of this length
    try:
        cached = load_fast(bad)
    except Exception as exc:  # noqa: BLE001
        cached = type(exc)
    if isinstance(uncached, type):
        assert cached is uncached
    else:
        same(cached, uncached)
