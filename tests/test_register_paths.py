"""``register`` writes a path that names the dataset: two builds' ``wds`` outputs registered with
``$DATA_ROOT_DIR`` unset once became the same ``${DATA_ROOT_DIR}/wds`` entry, so one name loaded the other
build's data and re-registering a name with another dataset was "unchanged"."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import shardsmith
from tests.media_factory import real_photos
from tests.test_cli_mistakes import assert_message, invoke


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory) -> tuple[Path, Path]:
    """Two finished builds (``cats/`` and ``dogs/``), each with its own ``wds`` output of 2 photos."""
    base = tmp_path_factory.mktemp("regpaths")
    outs = []
    for name, seed in (("cats", 1), ("dogs", 2)):
        real_photos(base / f"src_{name}", 2, seed=seed, min_side=40, max_side=64)
        shardsmith.build({"sources": [{"path": str(base / f"src_{name}")}],
                          "outputs": [{"format": "wds", "dir": "wds"}]}, base / name, quiet=True)
        outs.append(base / name / "wds")
    return outs[0], outs[1]


def test_unset_root_writes_each_datasets_own_absolute_path(two_builds, tmp_path, monkeypatch):
    from shardsmith.loaders import from_config

    cats, dogs = two_builds
    monkeypatch.delenv("DATA_ROOT_DIR", raising=False)
    cfg = tmp_path / "data.yaml"
    for name, ds in (("cats", cats), ("dogs", dogs)):
        code, out = invoke("register", ds, "--preset", "image", "--name", name, "--config", cfg)
        assert code == 0, out
        # the note's advice: export a root that holds the build, register again with --replace
        assert "DATA_ROOT_DIR is not set" in out and f"export DATA_ROOT_DIR={ds.parent.parent.resolve()}" in out, out
    data = yaml.safe_load(cfg.read_text())
    assert data["cats"]["path"] == cats.resolve().as_posix()
    assert data["dogs"]["path"] == dogs.resolve().as_posix()
    # whatever DATA_ROOT_DIR says at load time, each name loads its own dataset
    monkeypatch.setenv("DATA_ROOT_DIR", str(cats.parent))
    assert Path(from_config("dogs", config_file=cfg).folder).resolve() == dogs.resolve()
    assert Path(from_config("cats", config_file=cfg).folder).resolve() == cats.resolve()


def test_reregistering_a_name_with_another_dataset_needs_replace(two_builds, tmp_path, monkeypatch):
    cats, dogs = two_builds
    monkeypatch.delenv("DATA_ROOT_DIR", raising=False)
    cfg = tmp_path / "data.yaml"
    assert invoke("register", cats, "--preset", "image", "--name", "cats", "--config", cfg)[0] == 0
    before = cfg.read_text()
    assert invoke("register", cats, "--preset", "image", "--name", "cats", "--config", cfg)[0] == 0  # the same: ok
    code, out = invoke("register", dogs, "--preset", "image", "--name", "cats", "--config", cfg)
    assert_message(code, out, "already has a different entry 'cats'", "--replace")
    assert cfg.read_text() == before


def test_following_the_note_gives_a_portable_entry_that_loads(two_builds, tmp_path, monkeypatch):
    from shardsmith.loaders import from_config

    cats, dogs = two_builds
    monkeypatch.delenv("DATA_ROOT_DIR", raising=False)
    cfg = tmp_path / "data.yaml"
    assert invoke("register", dogs, "--preset", "image", "--name", "dogs", "--config", cfg)[0] == 0
    root = dogs.parent.parent.resolve()
    monkeypatch.setenv("DATA_ROOT_DIR", str(root))
    code, out = invoke("register", dogs, "--preset", "image", "--name", "dogs", "--config", cfg, "--replace")
    assert code == 0, out
    assert yaml.safe_load(cfg.read_text())["dogs"]["path"] == "${DATA_ROOT_DIR}/dogs/wds"
    assert 'os.path.join(os.environ["DATA_ROOT_DIR"], \'dogs/wds\')' in out
    assert Path(from_config("dogs", config_file=cfg).folder).resolve() == dogs.resolve()


def test_portable_path_only_under_the_root(two_builds, monkeypatch):
    from shardsmith.loaders.registry import RegistryError, portable_path

    cats, dogs = two_builds
    monkeypatch.delenv("DATA_ROOT_DIR", raising=False)
    assert portable_path(cats) == (cats.resolve().as_posix(), "")
    monkeypatch.setenv("DATA_ROOT_DIR", str(cats.parent))
    assert portable_path(cats) == ("${DATA_ROOT_DIR}/wds", str(cats.parent.resolve()))
    with pytest.raises(RegistryError, match="is not under"):
        portable_path(dogs)


def test_fastgen_snippet_of_an_absolute_entry_names_the_folder(two_builds, tmp_path, monkeypatch):
    cats, _ = two_builds
    monkeypatch.delenv("DATA_ROOT_DIR", raising=False)
    code, out = invoke("register", cats, "--preset", "image", "--name", "c", "--config", tmp_path / "d.yaml")
    assert code == 0, out
    assert f"datatags = [\"WDS:\" + {cats.resolve().as_posix()!r}]" in out, out
    assert f"shard_count_file = {(cats.resolve() / 'shard_count.json').as_posix()!r}" in out, out
    assert "os.environ[" not in out
