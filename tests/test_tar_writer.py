"""The shard writer's tar and hash: the bytes ``tarfile.addfile`` writes, the sha256 of the file."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile

import pytest

from shardsmith.sinks.tar import FIXED_MTIME, DeterministicTar, HashingWriter

MEMBERS = [
    ("a.txt", b""),
    ("a.cls", b"7"),
    ("b.latent.pth", os.urandom(511)),
    ("b.txt_emb.pth", os.urandom(512)),
    ("c with spaces.jpg", os.urandom(513)),
    ("d." + "x" * 120 + ".json", b'{"long": "name, PAX header"}'),
    ("e.caf\u00e9.txt", "non-ASCII name".encode()),
    ("f.big.pth", os.urandom(300_000)),  # past HashingWriter.ASYNC_HASH_BYTES
    ("g.big2.pth", os.urandom(70_000)),
]


def reference_tar(members) -> bytes:
    """What ``tarfile.addfile`` writes with the same header fields."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), FIXED_MTIME, 0o444
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_tar_bytes_equal_tarfile_addfile_and_the_hash_is_the_files(tmp_path):
    path = tmp_path / "00000.tar"
    with open(path, "wb") as f:
        out = HashingWriter(f)
        t = DeterministicTar(out)
        for name, data in MEMBERS:
            t.add(name, data)
        t.close()
        digest = out.hexdigest()
    got = path.read_bytes()
    assert got == reference_tar(MEMBERS)
    assert out.size == len(got) and len(got) % tarfile.RECORDSIZE == 0
    assert digest == hashlib.sha256(got).hexdigest()
    with tarfile.open(path) as t:
        assert [(m.name, t.extractfile(m).read()) for m in t.getmembers()] == MEMBERS


def test_hash_keeps_write_order_across_large_small_and_mutable_buffers(tmp_path):
    big = [os.urandom(HashingWriter.ASYNC_HASH_BYTES + k) for k in range(5)]
    ba = bytearray(os.urandom(200_000))  # mutable: hashed at once, not later
    pieces = [big[0], b"x", big[1], big[2], memoryview(b"y" * 100), ba, big[3], b"", big[4]]
    want = hashlib.sha256(b"".join(bytes(p) for p in pieces)).hexdigest()
    with open(tmp_path / "f", "wb") as f:
        out = HashingWriter(f)
        for p in pieces:
            out.write(p)
        ba[:] = b"\0" * len(ba)  # the caller reuses its buffer after write() returned
    assert out.hexdigest() == want == hashlib.sha256((tmp_path / "f").read_bytes()).hexdigest()


def test_a_failed_shard_write_leaves_no_file_and_no_helper_thread(tmp_path):
    import threading

    from shardsmith.records import SampleResult
    from shardsmith.recipe import WdsOutput
    from shardsmith.sinks.wds import WdsSink

    class Boom(bytes):
        def __len__(self):  # a member that fails while its shard is being written
            raise OSError("disk full")

    ok = SampleResult(0, "written", members={"latent.pth": os.urandom(200_000)})
    bad = SampleResult(1, "written", members={"latent.pth": Boom(b"z")})
    sink = WdsSink(WdsOutput(format="wds"), tmp_path)
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(OSError, match="disk full") as exc:  # (its traceback keeps the writer alive)
        sink.write_unit(0, [("k0", ok), ("k1", bad)])
    assert list(tmp_path.iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("shardsmith-sha256") and t.name not in before]
    del exc
    name, size, sha = sink.write_unit(0, [("k0", ok)])
    data = (tmp_path / name).read_bytes()
    assert (size, sha) == (len(data), hashlib.sha256(data).hexdigest())
