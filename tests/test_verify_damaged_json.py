"""A shard's ``json`` member that cannot be read is a damaged record named by its shard and member, never a
traceback: in ``decode`` (``verify/latent_records.py``, which read it with a bare ``json.loads``: a
``JSONDecodeError`` or ``RecursionError`` traceback, a ``TypeError`` / ``KeyError`` for JSON that is no
object or records no path) and in ``verify``'s knowledge-distillation checks (``verify/kd.py``: a
``RecursionError`` traceback for a json nested too deep).
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import torch

DEEP = b"[" * 100_000 + b"]" * 100_000  # more levels than Python's JSON parser follows

BAD_JSON = {
    "not JSON": (b"{not json", "is not valid JSON"),
    "nested too deep": (DEEP, "nested too deeply"),
    "a JSON list": (b"[1, 2]", "holds a JSON list, not an object"),
    "no media path": (b'{"fps": 1.0}', "records no media path"),
}


def _pth(t: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


def _shard(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return path


def _latent_shard(path: Path, x_json: bytes | None) -> Path:
    """Samples ``x`` (its json ``x_json``; None: no json member) and ``y`` (sound) of 4x8x8 latents."""
    good = {"id": "src/y.jpg", "path": "y.jpg", "fps": 1.0}
    members = {} if x_json is None else {"x.json": x_json}
    members["x.latent.pth"] = _pth(torch.zeros(4, 8, 8))
    members["y.json"] = json.dumps(good).encode()
    members["y.latent.pth"] = _pth(torch.ones(4, 8, 8))
    return _shard(path, members)


OUTPUT = {"format": "latent_wds", "files": {"train": {"dir": "latents", "shards": [{"name": "00000.tar", "count": 2}]}}}


@pytest.mark.parametrize("damage", [*BAD_JSON, "no json member"])
def test_latent_records_name_a_json_member_that_cannot_be_read_and_go_on(tmp_path, damage):
    from shardsmith.verify.latent_records import latent_records

    data, words = BAD_JSON.get(damage, (None, "missing"))
    shard = _latent_shard(tmp_path / "latents" / "00000.tar", data)
    damaged: list[dict] = []
    got = list(latent_records(tmp_path, OUTPUT, "train", "latents", "latent.pth", damaged, ("fps",)))
    assert [(rel, key) for rel, _z, _facts, key in got] == [("y.pt", "y")]  # the sound sample still comes
    assert len(damaged) == 1, damaged
    assert damaged[0]["file"] == str(shard) and damaged[0]["member"] == "x.json", damaged
    assert words in damaged[0]["error"], damaged


def test_latent_records_without_a_list_raise_one_user_error_naming_shard_and_member(tmp_path):
    from shardsmith.errors import UserError
    from shardsmith.verify.latent_records import latent_records

    shard = _latent_shard(tmp_path / "latents" / "00000.tar", DEEP)
    with pytest.raises(UserError) as exc:
        list(latent_records(tmp_path, OUTPUT, "train", "latents", "latent.pth"))
    assert f"{shard}: member x.json: is not valid JSON" in str(exc.value)


def test_a_precomputed_file_that_does_not_load_is_a_damaged_record(tmp_path):
    from shardsmith.verify.latent_records import latent_records

    folder = tmp_path / ".precomputed" / "latents"
    folder.mkdir(parents=True)
    torch.save({"latents": torch.zeros(4, 1, 8, 8), "fps": 1.0}, folder / "a.pt")
    (folder / "b.pt").write_bytes(b"truncated")
    torch.save({"fps": 1.0}, folder / "c.pt")
    output = {"format": "precomputed", "files": {"train": {"dir": ".precomputed"}}}
    damaged: list[dict] = []
    got = [rel for rel, *_ in latent_records(tmp_path, output, "train", "latents", "latent.pth", damaged)]
    assert got == ["a.pt"]
    assert [(Path(d["file"]).name, d["member"]) for d in damaged] == [("b.pt", None), ("c.pt", None)]
    assert "does not load" in damaged[0]["error"] and "holds no latents tensor" in damaged[1]["error"]


# --------------------------------------------------------------------------- verify: the kd checks

T_LIST = [0.999, 0.5, 0.0]


def _kd_folder(folder: Path, a_json: bytes) -> Path:
    """A kd_wds folder of one sample ``a`` (seed 7) whose json member is ``a_json``, with its index.json."""
    from shardsmith.formats.kd import KD_FORMAT
    from shardsmith.formats.wds import KD_INDEX_FILE, SHARD_COUNT_FILE

    _shard(folder / "00000.tar", {"a.json": a_json, "a.latent.pth": _pth(torch.zeros(2, 2)),
                                  "a.noise.pth": _pth(torch.zeros(2, 2)), "a.path.pth": _pth(torch.zeros(2, 2, 2)),
                                  "a.txt_emb.pth": _pth(torch.zeros(3, 4))})
    (folder / KD_INDEX_FILE).write_text(json.dumps({
        "format": KD_FORMAT, "t_list": T_LIST, "path_timesteps": T_LIST[:-1], "count": 1, "has_path": True,
        "shape": [2, 2], "dtype": "float32", "samples": [["00000.tar", "a", 7]]}))
    (folder / SHARD_COUNT_FILE).write_text(json.dumps({"00000.tar": 1}))
    return folder


@pytest.mark.parametrize("damage", ["nested too deep", "a JSON list"])
def test_verify_kd_names_a_json_member_that_cannot_be_read(tmp_path, damage):
    from shardsmith.verify.kd import check_kd

    data, words = BAD_JSON[damage]
    folder = _kd_folder(tmp_path / "kd", data)
    got: dict[str, tuple[bool, str]] = {}
    res = check_kd(folder, "kd_path", {}, lambda n, ok, d: got.__setitem__(n, (ok, d)))
    ok, detail = got["kd_seeds"]
    assert not ok and "00000.tar/a: member a.json" in detail and words in detail, detail
    assert "index.json says 7" in detail
    assert res["problems"]["kd_seeds"] and [n for n, (ok, _) in got.items() if not ok] == ["kd_seeds"], got


def test_verify_kd_still_checks_a_sound_json_seed(tmp_path):
    from shardsmith.verify.kd import check_kd

    got: dict[str, tuple[bool, str]] = {}
    check_kd(_kd_folder(tmp_path / "kd", b'{"seed": 7}'), "kd_path", {}, lambda n, ok, d: got.__setitem__(n, (ok, d)))
    assert all(ok for ok, _ in got.values()), got
    got.clear()
    check_kd(_kd_folder(tmp_path / "kd2", b'{"seed": 8}'), "kd_path", {}, lambda n, ok, d: got.__setitem__(n, (ok, d)))
    assert "00000.tar/a: json seed 8, index.json says 7" in got["kd_seeds"][1]


# --------------------------------------------------------------------------- decode, end to end


@pytest.mark.slow
def test_decode_names_the_damaged_json_member_decodes_the_rest_and_exits_1(tmp_path):
    from test_audit_decode_distill import hand_build
    from test_cli_mistakes import invoke

    build = hand_build(tmp_path / "b")
    shard = _latent_shard(build / "latents" / "00000.tar", DEEP)
    code, output = invoke("decode", build, "--out", tmp_path / "dec", "--output", "latent_wds", "--device", "cpu",
                          "-q")
    assert code == 1, output
    assert "Traceback" not in output and "RecursionError" not in output, output
    assert f"{shard}: member x.json: is not valid JSON" in output, output
    assert f"shardsmith verify {shard.parent}" in output and "--overwrite" in output, output
    rep = json.loads((tmp_path / "dec" / "decode_report.json").read_text())
    assert [r["file"] for r in rep["rows"]] == ["y.png"] and (tmp_path / "dec" / "y.png").is_file()
    assert [(d["file"], d["member"]) for d in rep["damaged"]] == [(str(shard), "x.json")]
