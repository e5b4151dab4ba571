"""The README's loader pattern, ``preset_config(...).model_copy(update=...)``, skips pydantic's validation:
``rank=2, world_size=2`` said "rank 2 gets no sample ... use fewer ranks", ``rank=5`` with
``allow_empty_rank=True`` raised ``KeyError: (5, 0)`` and ``batch_size=0`` hung on the first ``next()``.
The loader now validates its config where it is built, so every route gives the same message."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

import shardsmith
from tests.media_factory import real_photos


@pytest.fixture(scope="module")
def wds(tmp_path_factory) -> Path:
    """A finished ``wds`` output of 4 captioned photos in 2 shards."""
    base = tmp_path_factory.mktemp("cfgroutes")
    for p in real_photos(base / "src", 4, min_side=40, max_side=64):
        p.with_suffix(".txt").write_text(f"a photo {p.stem}")
    shardsmith.build({"sources": [{"path": str(base / "src")}],
                      "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 2}]}, base / "out", quiet=True)
    return base / "out" / "wds"


def _copied(wds: Path, **update):
    from shardsmith.loaders import preset_config

    return preset_config("image", wds, image_size=32).model_copy(update=update)


@pytest.mark.parametrize("update", [
    {"rank": 2, "world_size": 2, "deterministic": True},
    {"rank": 5, "world_size": 2, "deterministic": True, "allow_empty_rank": True},
    {"rank": -1, "world_size": 2},
])
def test_rank_out_of_range_is_the_config_message(wds, update):
    from shardsmith.loaders import WdsLoader, build_loader, preset_config

    with pytest.raises(ValidationError, match=r"need 0 <= rank < world_size"):
        preset_config("image", wds, **update)  # the keyword route: the message every route gives
    with pytest.raises(ValidationError, match=r"need 0 <= rank < world_size"):
        WdsLoader(_copied(wds, **update))
    with pytest.raises(ValidationError, match=r"need 0 <= rank < world_size"):
        build_loader(_copied(wds, **update))


def test_batch_size_zero_raises_instead_of_hanging(wds):
    from shardsmith.loaders import WdsLoader

    # in a daemon thread: the bug was an endless first next(), which the join's timeout ends here
    got: list[BaseException | str] = []

    def first() -> None:
        try:
            next(iter(WdsLoader(_copied(wds, batch_size=0))))
            got.append("yielded")
        except BaseException as exc:  # noqa: BLE001
            got.append(exc)

    t = threading.Thread(target=first, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "WdsLoader(batch_size=0) hung on the first next()"
    assert got and isinstance(got[0], ValidationError), got
    assert "batch_size" in str(got[0]) and "greater than or equal to 1" in str(got[0])


def test_the_readme_pattern_works_for_valid_values(wds):
    from shardsmith.loaders import WdsLoader

    seen = []
    for rank in (0, 1):
        cfg = _copied(wds, deterministic=True, rank=rank, world_size=2, batch_size=1, start_index=1)
        loader = WdsLoader(cfg)
        assert loader.config.rank == rank and loader.config.start_index == 1
        seen += [k for b in loader for k in b["__key__"]]
    assert len(seen) == len(set(seen)) == 3  # samples 1..3 of 4, each once across the ranks


def test_zip_config_copied_out_of_range_is_the_config_message(tmp_path):
    from shardsmith.loaders.zip import ZipLoaderConfig

    with pytest.raises(ValidationError, match=r"need 0 <= rank < world_size"):
        ZipLoaderConfig(path=tmp_path / "x.zip", rank=3, world_size=2)
    copied = ZipLoaderConfig(path=tmp_path / "x.zip").model_copy(update={"batch_size": 0})
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        copied.build()
