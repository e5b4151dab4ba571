"""The template writer gives exactly ``torch.save``'s bytes, through its fast path for records of
a structure already seen, and through ``torch.save`` itself for everything else."""

from __future__ import annotations

import io
import math
import threading

import pytest
import torch
from torch.utils.serialization import config as save_config

from shardsmith.sinks import pt_write
from shardsmith.sinks.precomputed import condition_record, latent_record, pt_bytes
from shardsmith.sinks.pt_write import pt_bytes_fast


def saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b


def make(dtype: torch.dtype, shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype in (torch.int64, torch.uint8):
        return torch.randint(0, 200, shape, generator=g, dtype=dtype)
    return (torch.randn(shape, generator=g) * 3).to(dtype)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """An empty template cache and zeroed counters for each test."""
    monkeypatch.setattr(pt_write, "_templates", {})
    monkeypatch.setattr(pt_write, "stats", dict.fromkeys(pt_write.stats, 0))


def check(obj) -> bytes:
    out = pt_bytes_fast(obj)
    assert type(out) is bytes
    assert out == saved(obj)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.bool])
@pytest.mark.parametrize("shape", [(4, 32, 32), (128, 1, 16, 24), (7,), (3, 5)])
def test_tensor_bytes_equal_torch_save_and_hit(dtype, shape):
    for seed in range(4):  # one template build, then three hits with other values
        check(make(dtype, shape, seed))
    assert pt_write.stats == {"hit": 3, "built": 1, "refused": 0, "fallback": 0}
    assert len(pt_write._templates) == 1 and next(iter(pt_write._templates.values())) is not None


@pytest.mark.parametrize("obj", [
    lambda s: make(torch.bfloat16, (512, 4096), s),
    lambda s: torch.tensor(float(s) + 0.5),                  # 0-d
    lambda s: torch.tensor(s, dtype=torch.int64),            # 0-d int
    lambda s: torch.empty(0, 4),                             # empty record (no data descriptor)
    lambda s: torch.zeros(2, 3, dtype=torch.bfloat16) + s,   # constant values
    lambda s: torch.empty(0, dtype=torch.bfloat16)[None],    # empty, 2-d
])
def test_edge_tensors(obj):
    outs = {check(obj(s)) for s in range(3)}
    assert pt_write.stats["hit"] == 2 and pt_write.stats["built"] == 1
    assert len(outs) >= 1


def test_values_change_same_shape_bytes_change():
    a, b = make(torch.bfloat16, (4, 32, 32), 1), make(torch.bfloat16, (4, 32, 32), 2)
    ba, bb = check(a), check(b)
    assert ba != bb and len(ba) == len(bb)
    assert pt_write.stats["hit"] == 1


def test_latent_records():
    for i, fps in enumerate([24.0, 24.0, 30.0, 23.976, -0.0, 0.0, float("nan"), 1e300, 24.0]):
        rec = latent_record(make(torch.bfloat16, (4, 32, 32), i), fps)
        out = check(rec)
        same(torch.load(io.BytesIO(out), weights_only=True), rec)
    # fps values: 24.0 hits twice, every other value (by its bits) is its own structure
    assert pt_write.stats["built"] == 7 and pt_write.stats["hit"] == 2
    for i in range(3):
        rec = {"latents": make(torch.float32, (4, 2, 16, 24), i), "num_frames": 2, "height": 16, "width": 24,
               "fps": 24.0}
        check(rec)
    rec["num_frames"] = 3
    check(rec)
    assert pt_write.stats["built"] == 9 and pt_write.stats["hit"] == 4


def test_condition_records():
    for i in range(4):
        mask = torch.zeros(128, dtype=torch.int64)
        mask[: 10 * (i + 1)] = 1
        rec = condition_record(make(torch.bfloat16, (128, 64), i), mask)
        same(torch.load(io.BytesIO(check(rec)), weights_only=True), rec)
        rec = condition_record(make(torch.bfloat16, (128, 64), i), mask, make(torch.bfloat16, (128, 32), i + 9))
        same(torch.load(io.BytesIO(check(rec)), weights_only=True), rec)
    assert pt_write.stats["built"] == 2 and pt_write.stats["hit"] == 6


def test_dicts_of_many_kinds():
    for i in range(3):
        rec = {"a": make(torch.float32, (3, 4), i), "empty": torch.empty(0, 2), "n": i % 1, "b": True, "none": None,
               "s": "hello", "big": 2**70, "neg": -5, "c": make(torch.uint8, (5,), i), "d": torch.tensor(i)}
        same(torch.load(io.BytesIO(check(rec)), weights_only=True), rec)
    assert pt_write.stats["hit"] == 2
    for rec in ({}, {"only": 1}, {"x": 1.5, "y": "z"}):
        check(rec)
        check(dict(rec))
    # True == 1 and hash alike, but pickle differently: they must be different structures
    check({"v": 1, "t": torch.ones(2)})
    check({"v": True, "t": torch.ones(2)})


def test_round_trip():
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.bool):
        for s in range(2):
            t = make(dtype, (2, 3, 5), s)
            same(torch.load(io.BytesIO(check(t)), weights_only=True), t)


@pytest.mark.parametrize("obj", [
    lambda: make(torch.float32, (4, 8), 0).t(),                        # non-contiguous
    lambda: make(torch.float32, (4, 8), 0)[:2],                        # view of a larger storage, offset 0
    lambda: make(torch.float32, (4, 8), 0)[1:],                        # storage offset
    lambda: make(torch.float32, (4, 8), 0)[:, ::2],                    # strided
    lambda: make(torch.float32, (4, 8), 0).expand(3, 4, 8),            # stride 0
    lambda: make(torch.float32, (3,), 0).requires_grad_(),
    lambda: torch.nn.Parameter(make(torch.float32, (3,), 0), requires_grad=False),
    lambda: torch.randn(3, dtype=torch.complex64),
    lambda: torch.arange(5, dtype=torch.int32).to_sparse(),
    lambda: (lambda t: {"a": t, "b": t})(make(torch.float32, (3,), 0)),            # shared storage
    lambda: (lambda t: {"a": t, "b": t.view(3, 1)})(make(torch.float32, (3,), 0)),
    lambda: {"a": make(torch.float32, (3,), 0), "where": "cpu"},                   # pickle memo risks
    lambda: {"a": make(torch.float32, (3,), 0), "k": "0"},
    lambda: {"a": make(torch.float32, (3,), 0), "x": "same", "y": "same"},
    lambda: {"a": make(torch.float32, (3,), 0), "same": "same"},
    lambda: {1: make(torch.float32, (3,), 0)},
    lambda: {"a": [1, 2]},
    lambda: [make(torch.float32, (3,), 0)],
    lambda: 5,
])
def test_fallbacks_still_equal(obj):
    for _ in range(2):
        check(obj())
    # refused by its signature, or (str memo risks) when its template would be built
    assert pt_write.stats["hit"] == pt_write.stats["built"] == 0
    assert all(tpl is None for tpl in pt_write._templates.values())


def test_self_check_failure_falls_back(monkeypatch):
    monkeypatch.setattr(pt_write, "_combine", lambda seed, v: 0)  # a wrong serialization id
    for s in range(3):
        check(make(torch.bfloat16, (4, 32, 32), s))
    assert pt_write.stats == {"hit": 0, "built": 0, "refused": 1, "fallback": 2}
    assert list(pt_write._templates.values()) == [None]


def test_torch_save_settings_are_part_of_the_structure():
    t = make(torch.float32, (4, 4), 0)
    check(t)
    check(make(torch.float32, (4, 4), 1))
    torch.serialization.set_crc32_options(False)
    try:
        for s in range(3):
            check(make(torch.float32, (4, 4), s))  # zero CRCs: no template, torch.save
    finally:
        torch.serialization.set_crc32_options(True)
    with save_config.patch({"save.storage_alignment": 256}):
        for s in range(3):
            check(make(torch.float32, (4, 4), s))
    check(make(torch.float32, (4, 4), 5))
    assert pt_write.stats["refused"] == 1 and pt_write.stats["built"] == 2


def test_cache_is_bounded():
    for n in range(1, pt_write._MAX_TEMPLATES + 40):
        pt_bytes_fast(torch.zeros(n, dtype=torch.uint8))
    assert len(pt_write._templates) <= pt_write._MAX_TEMPLATES
    check(torch.ones(3, dtype=torch.uint8))


def test_two_threads():
    errors = []

    def work(k):
        for s in range(50):
            rec = latent_record(make(torch.bfloat16, (4, 16, 16), s * 2 + k), 24.0)
            if pt_bytes_fast(rec) != saved(rec):
                errors.append((k, s))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors


def test_precomputed_pt_bytes_uses_it():
    rec = latent_record(make(torch.bfloat16, (4, 32, 32), 0), 24.0)
    assert pt_bytes(rec) == saved(rec)
    rec = latent_record(make(torch.bfloat16, (4, 32, 32), 1), 24.0)
    assert pt_bytes(rec) == saved(rec)
    assert pt_write.stats["hit"] == 1


@pytest.mark.parametrize("dtype,shape", [(torch.float32, (5, 4, 8, 8)), (torch.bfloat16, (3, 16, 2, 4, 4)),
                                         (torch.float16, (2, 77, 64)), (torch.int64, (4, 3))])
def test_rows_equal_torch_save_of_each_row(dtype, shape):
    """pt_bytes_rows renders every row from the batch's memory: the bytes torch.save gives for that
    row as a tensor of its own."""
    from shardsmith.sinks.pt_write import pt_bytes_rows

    batch = (torch.randn(shape) * 100).to(dtype)
    rows = pt_bytes_rows(batch)
    assert len(rows) == shape[0]
    for i, data in enumerate(rows):
        assert data == saved(batch[i].clone())
    for i, data in enumerate(rows):  # and they read back as the rows
        assert torch.equal(torch.load(io.BytesIO(data), weights_only=True), batch[i])


def test_rows_of_a_batch_that_is_not_plain_go_row_by_row():
    from shardsmith.sinks.pt_write import pt_bytes_rows

    base = torch.randn(6, 4, 8)
    odd = base[::2]  # not contiguous
    assert pt_bytes_rows(odd) == [saved(odd[i].clone()) for i in range(3)]
    assert pt_bytes_rows(torch.empty(0, 4)) == []
