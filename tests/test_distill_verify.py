"""``verify`` of knowledge-distillation datasets (``verify/kd.py``, presets ``kd_pair`` / ``kd_path``).

One ``shardsmith distill`` build with the exact Gaussian teacher (``shardsmith.distill.gaussian:velocity``,
CPU, seconds) is made once; each test that damages it works on a copy of its ``kd/`` folder taken out of
the build (so only the shards and ``index.json`` can tell). A good dataset passes; a path of 3 states, a
NaN in a latent, a sample deleted from its shard, a seed changed in a json member and an edited
``path_timesteps`` each fail, naming the sample (or the field of index.json) and what is wrong.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
import torch

from shardsmith.formats.wds import KD_INDEX_FILE, SHARD_COUNT_FILE

pytestmark = pytest.mark.slow  # every test reads the distill build (~7 s, once per session)

FASTGEN_T_LIST = [0.999, 0.937, 0.833, 0.624, 0.0]
SHAPE = [2, 4, 4]
RECIPE = f"""sources: [{{path: prompts.jsonl, columns: {{caption: prompt}}}}]
split: {{holdout: 0.25, seed: 1}}
outputs: [{{format: kd_wds, samples_per_shard: 4}}]
models:
  teacher: {{family: callable, entry_point: "shardsmith.distill.gaussian:velocity", parameterisation: flow}}
  text: {{family: minilm}}
  device: cpu
distill: {{shape: {SHAPE}, steps: 8}}
"""
_BUILT: dict[str, Path] = {}


def build_kd(tmp_path_factory) -> Path:
    """The build folder of ``shardsmith distill`` on 12 prompts (8 train, in 2 shards of 4), made once per
    session (test_distill_fastgen.py reads it too)."""
    if "out" not in _BUILT:
        from shardsmith.api import distill

        root = tmp_path_factory.mktemp("kd_build")
        (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"prompt number {i}"}) + "\n"
                                                    for i in range(12)))
        (root / "r.yaml").write_text(RECIPE)
        distill(root / "r.yaml", root / "out")
        _BUILT["out"] = root / "out"
    return _BUILT["out"]


@pytest.fixture(scope="module")
def kd_build(tmp_path_factory) -> Path:
    return build_kd(tmp_path_factory)


@pytest.fixture
def kd_copy(kd_build, tmp_path) -> Path:
    """A copy of the build's kd/ folder outside any build (no manifest, no ledger)."""
    return Path(shutil.copytree(kd_build / "kd", tmp_path / "kd"))


# --------------------------------------------------------------------------- damaging a copy


def _members(shard: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(shard) as tf:
        return [(ti, tf.extractfile(ti).read()) for ti in tf.getmembers()]


def _write(shard: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> None:
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tf:
        for ti, data in members:
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))


def _first(folder: Path) -> tuple[Path, str]:
    """The first shard and the key of its first sample."""
    index = json.loads((folder / KD_INDEX_FILE).read_text())
    shard, key, _seed = index["samples"][0]
    return folder / shard, key


def _edit_member(folder: Path, name: str, fn) -> str:
    """Replace member ``<key>.<name>`` of the first sample with ``fn(its bytes)``; the sample's ``shard/key``."""
    shard, key = _first(folder)
    out = [(ti, fn(data) if ti.name == f"{key}.{name}" else data) for ti, data in _members(shard)]
    _write(shard, out)
    return f"{shard.name}/{key}"


def _edit_pth(folder: Path, name: str, fn) -> str:
    def edit(data: bytes) -> bytes:
        buf = io.BytesIO()
        torch.save(fn(torch.load(io.BytesIO(data), weights_only=True)).clone(), buf)
        return buf.getvalue()
    return _edit_member(folder, name, edit)


def _with_nan(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[3] = float("nan")
    return t


def _new_seed(data: bytes) -> bytes:
    meta = json.loads(data)
    meta["seed"] += 1
    return json.dumps(meta).encode()


def _delete_sample(folder: Path) -> str:
    """Remove the first sample from its shard (shard_count.json follows, index.json does not)."""
    shard, key = _first(folder)
    _write(shard, [(ti, d) for ti, d in _members(shard) if not ti.name.startswith(key + ".")])
    counts = json.loads((folder / SHARD_COUNT_FILE).read_text())
    counts[shard.name] -= 1
    (folder / SHARD_COUNT_FILE).write_text(json.dumps(counts))
    return f"{shard.name}/{key}"


def _edit_path_timesteps(folder: Path) -> str:
    index = json.loads((folder / KD_INDEX_FILE).read_text())
    index["path_timesteps"] = [0.999, 0.9, 0.833, 0.624]
    (folder / KD_INDEX_FILE).write_text(json.dumps(index))
    return "path_timesteps"


def kd_checks(folder: Path, preset: str = "kd_path") -> tuple[dict[str, tuple[bool, str]], dict]:
    """verify/kd.py's checks of ``folder`` alone (no loader processes): ``{name: (ok, detail)}`` and its result."""
    from shardsmith.formats.wds import read_ignore_index
    from shardsmith.verify.kd import check_kd

    got: dict[str, tuple[bool, str]] = {}
    res = check_kd(folder, preset, read_ignore_index(folder), lambda n, ok, d: got.__setitem__(n, (ok, d)))
    return got, res


# --------------------------------------------------------------------------- a good dataset


def test_a_good_dataset_passes_verify_with_kd_path_picked_from_its_build(kd_build):
    from shardsmith.verify.runner import format_verify, verify

    rep = verify(kd_build / "kd")
    assert rep["preset"] == "kd_path" and "kd_wds" in rep["preset_from"]
    names = {c["name"]: c for c in rep["checks"]}
    for name in ("kd_index", "kd_seeds", "kd_states", "kd_shapes", "kd_finite", "coverage", "manifest"):
        assert names[name]["ok"], format_verify(rep)
    assert rep["ok"], format_verify(rep)
    assert rep["kd"]["t_list"] == FASTGEN_T_LIST and rep["kd"]["expected_states"] == 4
    assert rep["kd"]["samples"] == 8 and rep["kd"]["problems"] == {}
    assert rep["contract"]["keys"]["path"]["shape"] == [4, *SHAPE]


@pytest.mark.parametrize("preset", ["kd_pair", "kd_path"])
def test_a_good_dataset_passes_every_kd_check(kd_copy, preset):
    got, res = kd_checks(kd_copy, preset)
    assert set(got) == {"kd_index", "kd_seeds", "kd_states", "kd_shapes", "kd_finite"}
    assert all(ok for ok, _ in got.values()), got
    assert "8 sample(s)" in got["kd_index"][1] and "[2, 4, 4] (float32)" in got["kd_shapes"][1]
    assert res["samples"] == 8


# --------------------------------------------------------------------------- each damage fails, naming it


DAMAGE = {
    "path of 3 states": (lambda f: _edit_pth(f, "path.pth", lambda p: p[:3]), "kd_states", "holds 3 state(s)"),
    "NaN in a latent": (lambda f: _edit_pth(f, "latent.pth", _with_nan), "kd_finite", "latent.pth holds 1 NaN"),
    "sample deleted": (_delete_sample, "kd_index", "listed in index.json, not in the shards"),
    "seed changed": (lambda f: _edit_member(f, "json", _new_seed), "kd_seeds", "index.json says"),
    "path_timesteps edited": (_edit_path_timesteps, "kd_index", "is not t_list[:-1] [0.999, 0.937, 0.833, 0.624]"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_each_damage_fails_naming_the_sample(kd_copy, damage):
    make, check, words = DAMAGE[damage]
    named = make(kd_copy)
    got, res = kd_checks(kd_copy)
    ok, detail = got[check]
    assert not ok, detail
    assert named in detail and words in detail, detail
    assert any(named in m and words in m for m in res["problems"][check])
    # the other kd checks are not fooled into failing
    assert [n for n, (ok, _) in got.items() if not ok] == [check], got


def test_a_sample_in_the_shards_that_index_json_does_not_list_is_named(kd_copy):
    index = json.loads((kd_copy / KD_INDEX_FILE).read_text())
    shard, key, _ = index["samples"].pop()
    index["count"] -= 1
    (kd_copy / KD_INDEX_FILE).write_text(json.dumps(index))
    got, _ = kd_checks(kd_copy)
    assert not got["kd_index"][0]
    assert f"{shard}/{key}: in the shards, not listed in index.json" in got["kd_index"][1]


def test_noise_of_another_shape_is_named(kd_copy):
    named = _edit_pth(kd_copy, "noise.pth", lambda t: t[:1])
    got, _ = kd_checks(kd_copy)
    assert not got["kd_shapes"][0]
    assert f"{named}: shapes differ" in got["kd_shapes"][1] and "noise.pth [1, 4, 4]" in got["kd_shapes"][1]


def test_verify_fails_on_a_damaged_copy_through_the_cli(kd_copy):
    from typer.testing import CliRunner

    from shardsmith.cli import app

    named = _edit_pth(kd_copy, "latent.pth", _with_nan)
    res = CliRunner().invoke(app, ["verify", str(kd_copy), "--preset", "kd_path"])
    assert res.exit_code != 0, res.output
    assert f"[FAIL] kd_finite: 1 problem(s): {named}: latent.pth holds 1 NaN" in res.output


# --------------------------------------------------------------------------- without index.json: FastGen's rule


def test_without_index_json_path_needs_fastgens_4_states(kd_copy):
    (kd_copy / KD_INDEX_FILE).unlink()
    got, res = kd_checks(kd_copy)
    assert "kd_seeds" not in got and all(ok for ok, _ in got.values()), got
    assert "FastGen's rule (4)" in got["kd_index"][1] and res["expected_states"] == 4


def test_without_index_json_a_path_of_3_states_fails(kd_copy):
    shard, key = _first(kd_copy)
    named = _edit_pth(kd_copy, "path.pth", lambda p: p[:3])
    assert named == f"{shard.name}/{key}"
    (kd_copy / KD_INDEX_FILE).unlink()
    got, _ = kd_checks(kd_copy)
    assert not got["kd_states"][0]
    assert f"{named}: path.pth holds 3 state(s) (shape [3, 2, 4, 4]), 4 expected" in got["kd_states"][1]


def test_the_preset_is_picked_from_index_json_where_no_build_names_the_folder(kd_copy, kd_build):
    from shardsmith.loaders.mode_presets import kd_preset_for

    assert kd_preset_for(kd_build / "kd")[0] == "kd_path"
    name, where = kd_preset_for(kd_copy)
    assert name == "kd_path" and "shardsmith-kd" in where
    index = json.loads((kd_copy / KD_INDEX_FILE).read_text())
    (kd_copy / KD_INDEX_FILE).write_text(json.dumps({**index, "has_path": False}))
    assert kd_preset_for(kd_copy)[0] == "kd_pair"
    (kd_copy / KD_INDEX_FILE).unlink()
    assert kd_preset_for(kd_copy) is None


def test_a_malformed_index_entry_is_named_not_raised(kd_copy):
    index = json.loads((kd_copy / KD_INDEX_FILE).read_text())
    shard, key, _ = index["samples"][2]
    index["samples"][2] = [shard, key]
    (kd_copy / KD_INDEX_FILE).write_text(json.dumps(index))
    got, _ = kd_checks(kd_copy)
    assert not got["kd_index"][0]
    assert f"samples[2] is not [shard, key, seed]: ['{shard}', '{key}']" in got["kd_index"][1]
    assert f"{shard}/{key}: in the shards, not listed in index.json" in got["kd_index"][1]


def test_an_index_json_of_another_tool_falls_back_to_fastgens_rule(kd_copy):
    (kd_copy / KD_INDEX_FILE).write_text(json.dumps({"format": "other", "path_timesteps": [1.0]}))
    got, res = kd_checks(kd_copy)
    assert all(ok for ok, _ in got.values()) and "kd_seeds" not in got, got
    assert "index.json is not shardsmith's (format 'other'): path states checked by FastGen's rule (4)" \
        in got["kd_index"][1]
    assert res["index"] is None and res["expected_states"] == 4
