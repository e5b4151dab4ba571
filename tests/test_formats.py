"""formats/: the one place for on-disk layouts. Light to import, one rule per question."""

import io
import json
import subprocess
import sys
import tarfile
import zipfile

import pytest

from shardsmith.formats import detect, precomputed, tar, wds
from shardsmith.formats import zip as zip_layout


def test_formats_imports_nothing_heavy_and_no_stage():
    code = ("import sys, shardsmith.formats, shardsmith.formats.detect; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'PIL', 'webdataset', 'numpy') "
            "or m.startswith(('shardsmith.sinks', 'shardsmith.loaders', 'shardsmith.verify'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_one_shard_listing_rule(tmp_path):
    for name in ("00002.tar", "00010.tar", "00001.TAR", "x.tar.gz", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "00003.tar").mkdir()  # a folder is not a shard
    listing = wds.list_shards(tmp_path)
    assert listing.names == ["00001.TAR", "00002.tar", "00010.tar"] and listing.unnumbered == []
    (tmp_path / "extra.tar").write_bytes(b"")
    listing = wds.list_shards(tmp_path)
    assert listing.names == ["00001.TAR", "00002.tar", "00010.tar", "extra.tar"]  # by name
    assert listing.unnumbered == ["extra"]
    with pytest.raises(FileNotFoundError):
        wds.list_shards(tmp_path / "missing")


def test_one_ignore_index_rule(tmp_path):
    assert wds.load_ignore_index(tmp_path) == (None, None) and wds.read_ignore_index(tmp_path) == {}
    (tmp_path / wds.IGNORE_INDEX_FILE).write_text(json.dumps({"00000.tar": ["a", "b"]}))
    assert wds.read_ignore_index(tmp_path) == {"00000.tar": ["a", "b"]}
    for bad in ('{"00000.tar": "ab"}', "[1]", "{not json"):
        (tmp_path / wds.IGNORE_INDEX_FILE).write_text(bad)
        data, err = wds.load_ignore_index(tmp_path)
        assert data is None and err.startswith(wds.IGNORE_INDEX_FILE)
        with pytest.raises(ValueError, match="ignore_index.json"):
            wds.read_ignore_index(tmp_path)


def test_shard_counts_shape(tmp_path):
    assert wds.load_shard_counts(tmp_path) == (None, None)
    (tmp_path / wds.SHARD_COUNT_FILE).write_text('{"00000.tar": 3}')
    assert wds.load_shard_counts(tmp_path) == ({"00000.tar": 3}, None)
    (tmp_path / wds.SHARD_COUNT_FILE).write_text('{"00000.tar": "3"}')
    assert wds.load_shard_counts(tmp_path) == (None, "shard_count.json is not {shard: int}")


def test_member_rules():
    assert wds.group_members([("a.jpg", 512, 3), ("a.latent.pth", 1536, 9), ("noext", 0, 0), ("b.txt", 2560, 1)]) == [
        ("a", {"jpg": (512, 3), "latent.pth": (1536, 9)}), ("b", {"txt": (2560, 1)})]
    assert wds.media_suffix("x/a.JPEG") == "jpg" and wds.media_suffix("a.mp4") == "mp4"
    assert wds.media_suffix("a") == "bin"
    assert wds.is_numbered_shard("00003.tar") and not wds.is_numbered_shard("00003.TAR")
    assert not wds.is_numbered_shard("a.tar")
    assert wds.is_metadata_member("__key__") and wds.is_metadata_member("__meta__/a.txt")
    assert not wds.is_metadata_member("a/__x__") and not wds.is_metadata_member("__a.txt")
    events = [{"shard": "00000.tar"}]
    assert wds.repair_log_events(json.loads(json.dumps(wds.repair_log_document(events)))) == events
    with pytest.raises(KeyError):
        wds.repair_log_events({})


def test_tar_arithmetic_matches_tarfile():
    for name, size in (("k.jpg", 0), ("k.jpg", 1), ("k.latent.pth", 512), ("k" * 120 + ".txt", 513)):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            info = tarfile.TarInfo(name)
            info.size = size
            tf.addfile(info, io.BytesIO(bytes(size)))
            members_end = tf.offset
        exact = len(name) <= tar.MAX_USTAR_NAME
        assert members_end == tar.member_bytes(name, size) if exact else members_end <= tar.member_bytes(name, size)
        assert len(buf.getvalue()) - members_end <= tar.END_BYTES
        block = buf.getvalue()[:tar.BLOCK]
        assert tar.tar_header_ok(block)  # the member's header, or the PAX header before it
    assert tar.padding(1) == 511 and tar.padded(513) == 1024 and not tar.tar_header_ok(tar.ZERO_BLOCK)


def test_precomputed_layout(tmp_path):
    assert precomputed.mirrored("clips/a.mp4", None) == "clips/a.pt"
    assert precomputed.mirrored("a.mp4", "src") == "src/a.pt"
    with pytest.raises(ValueError):
        precomputed.mirrored("../a.mp4", None)
    assert precomputed.primary_dir(["conditions", "latents"]) == "latents"
    assert precomputed.primary_dir(["conditions", "audio_latents"]) == "conditions"
    for d in ("audio_masks", "latents"):
        (tmp_path / d / "x").mkdir(parents=True)
        (tmp_path / d / "x" / "b.pt").write_bytes(b"")
    assert precomputed.present_dirs(tmp_path) == ["latents", "audio_masks"]
    assert precomputed.cache_files(tmp_path, "latents") == ["x/b.pt"]


def test_zip_layout(tmp_path):
    path = tmp_path / "d.zip"
    rows = [[zip_layout.zip_member_name(i), i % 2] for i in range(3)]
    with zipfile.ZipFile(path, "w") as zf:
        for name, _ in rows:
            zf.writestr(zip_layout.zip_entry(name), b"")
        zf.writestr(zip_layout.zip_entry(zip_layout.ZIP_LABELS_FILE), zip_layout.labels_document(rows))
    with zipfile.ZipFile(path) as zf:
        assert zip_layout.read_labels(zf) == rows
        assert [zip_layout.is_sample_member(n) for n in zf.namelist()] == [True, True, True, False]
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}


def test_detect(tmp_path):
    (tmp_path / "d.zip").write_bytes(b"")
    assert detect.dataset_kind(tmp_path / "d.zip") == "zip"
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "00000.tar").write_bytes(b"")
    assert detect.dataset_kind(tmp_path / "w") == "wds"
    (tmp_path / "p" / "conditions").mkdir(parents=True)
    assert detect.dataset_kind(tmp_path / "p") == "precomputed"
    with pytest.raises(ValueError, match="neither"):
        detect.dataset_kind(tmp_path)
    assert detect.enclosing_build(tmp_path / "w") is None and not detect.is_build(tmp_path)
    (tmp_path / "manifest.json").write_text("{}")
    found = detect.enclosing_build(tmp_path / "w" / "00000.tar")
    assert found == detect.BuildFolder(tmp_path.resolve(), False, True)
