"""Coordinate-descent winners reused across processes where torch loses them (shardsmith.encode.coordesc_cache):
the bug's shape (pytorch/pytorch#172819) reproduced on stand-ins, since Triton kernels need a GPU."""

from __future__ import annotations

import json
import types

import pytest

from shardsmith.encode import coordesc_cache


class _Config:
    def __init__(self, block: int, found: bool = False) -> None:
        self.block = block
        if found:
            self.found_by_coordesc = True


def _hashable(cfg):
    return ("XBLOCK", cfg.block)


class _Buggy:
    """The method before the fix, as torch 2.11 has it (its shape: skips one config, drops the mark)."""

    def recheck_autotune_cache(self, reload_kernel_from_src):
        configs = [result.config for result in self.compile_results]
        (cached_configs, _, autotune_cache_info) = _fake_th.check_autotune_cache(configs, self.filename,
                                                                                self.inductor_meta)
        if len(cached_configs) == 1 and len(configs) > 1:
            best_config = cached_configs[0]
            best_config_hash = _hashable(best_config)
            for compile_result in self.compile_results:
                if _hashable(compile_result.config) == best_config_hash:
                    self.compile_results = [compile_result]
                    return
            if best_config.found_by_coordesc:
                self.compile_results = [self._precompile_config(best_config)]

    def run_tunes(self) -> bool:
        """What ``run()`` decides: tune again unless the launcher's config carries the mark."""
        return not getattr(self.compile_results[0].config, "found_by_coordesc", False)


_fake_th = types.SimpleNamespace()


@pytest.fixture
def patched(monkeypatch):
    cls = type("CachingAutotuner", (_Buggy,), {})
    winner: list = []
    _fake_th.CachingAutotuner = cls
    _fake_th.triton_config_to_hashable = _hashable
    _fake_th.check_autotune_cache = lambda configs, filename, meta: (list(winner) or configs, None, {})
    import torch._inductor.runtime as runtime

    monkeypatch.setattr(runtime, "triton_heuristics", _fake_th, raising=False)
    monkeypatch.setitem(__import__("sys").modules, "torch._inductor.runtime.triton_heuristics", _fake_th)
    return cls, winner


def _tuner(cls, configs):
    t = cls()
    t.compile_results = [types.SimpleNamespace(config=c) for c in configs]
    t.filename, t.inductor_meta = "/cache/k.py", {"coordinate_descent_tuning": True}
    t.fn = types.SimpleNamespace(fn=object())
    t.compiled = []
    t._precompile_config = lambda cfg: (t.compiled.append(cfg.block), types.SimpleNamespace(config=cfg))[1]
    return t


@pytest.mark.parametrize("configs, winner, compiled, buggy", [
    ([64], 64, [], True),  # one config, the winner is it: the original skipped it and run() tuned again
    ([64, 128], 128, [], True),  # several, the winner among them: the original narrowed but dropped the mark
    ([64], 256, [256], True),  # one config, the winner found beyond it: compiled, as the fixed torch does
    ([64, 128], 256, [256], False),  # several, beyond them: the original compiled it (right); not compiled twice
])
def test_a_cached_coordesc_winner_is_not_tuned_again(patched, configs, winner, compiled, buggy):
    cls, cached = patched
    cached.append(_Config(winner, found=True))
    before = _tuner(cls, [_Config(b) for b in configs])
    before.recheck_autotune_cache(lambda: None)
    assert before.run_tunes() == buggy  # (the bug: every process tunes again)
    assert coordesc_cache.keep() and coordesc_cache.keep()  # (idempotent)
    t = _tuner(cls, [_Config(b) for b in configs])
    t.recheck_autotune_cache(lambda: None)
    assert not t.run_tunes()
    assert [r.config.block for r in t.compile_results] == [winner] and t.compiled == compiled


def test_a_winner_not_found_by_coordesc_changes_nothing(patched):
    cls, cached = patched
    cached.append(_Config(128))
    assert coordesc_cache.keep()
    t = _tuner(cls, [_Config(64), _Config(128)])
    t.recheck_autotune_cache(lambda: None)
    assert [r.config.block for r in t.compile_results] == [128] and t.compiled == []


def test_a_fixed_recheck_is_left_as_it_is():
    """This machine's torch has pytorch#172819's fix: its recheck is not wrapped (the other two mends are)."""
    from torch._inductor.runtime import triton_heuristics as th

    before = th.CachingAutotuner.recheck_autotune_cache
    assert not coordesc_cache.has_bug(before)
    assert coordesc_cache.keep() is True and th.CachingAutotuner.recheck_autotune_cache is before
    assert {"_coordinate_descent_tuning", "populate_cache"} <= set(coordesc_cache.counts()["mended"])
    assert coordesc_cache.has_bug(_Buggy.recheck_autotune_cache)


def test_without_its_source_the_torch_version_decides(monkeypatch):
    def unreadable(obj):
        raise OSError("could not get source code")

    monkeypatch.setattr(coordesc_cache.inspect, "getsource", unreadable)
    assert coordesc_cache.has_bug(_Buggy.recheck_autotune_cache, "2.11.0+cu130")
    assert not coordesc_cache.has_bug(_Buggy.recheck_autotune_cache, "2.12.1")
    assert not coordesc_cache.has_bug(_Buggy.recheck_autotune_cache, "2.13.0+cpu")


# ---- the two losses past the recheck: a pickled config's mark, and an artifact's entry written over the winner


class _Cache:
    """Stand-in of Inductor's ``AutotuneCache``: the entry its ``.best_config`` file holds, for ``configs_hash``."""

    def __init__(self, entry, configs_hash="h1"):
        self.entry, self.configs_hash = entry, configs_hash

    def _read(self):
        return dict(self.entry) if self.entry is not None else None

    def save(self, *args, **kwargs):
        pass


def _load(best, configs_hash, configs, meta):
    """Stand-in of ``_load_cached_autotuning`` (Triton's Config needs Triton): the same decisions."""
    if best.pop("configs_hash", None) != configs_hash:
        return None
    if meta.get("coordinate_descent_tuning") and best.pop("found_by_coordesc", False):
        return _Config(best["XBLOCK"], found=True)
    return None


class _Launcher:
    def __init__(self, cfg):
        self.config = cfg


@pytest.fixture
def tuning(patched, monkeypatch):
    """A stand-in autotuner whose tuning records that it ran (what ``run()`` calls where the mark is missing)."""
    from torch._inductor.runtime import autotune_cache as ac

    cls, _ = patched
    tuned: list = []
    cls._coordinate_descent_tuning = lambda self, launcher, *a, **k: (tuned.append(launcher.config.block),
                                                                      _Launcher(_Config(999, found=True)))[1]
    monkeypatch.setattr(ac, "_load_cached_autotuning", _load)
    return cls, tuned


def _kernel(cls, entry, launcher_block=64, configs_hash="h1"):
    t = _tuner(cls, [_Config(launcher_block)])
    t.save_cache_hook = _Cache(entry, configs_hash).save
    t.lock = __import__("threading").Lock()
    t._precompile_config = lambda cfg: (t.compiled.append(cfg.block),
                                        types.SimpleNamespace(make_launcher=lambda: _Launcher(cfg)))[1]
    return t


_WINNER = {"XBLOCK": 256, "num_warps": 4, "num_stages": 1, "configs_hash": "h1", "found_by_coordesc": True}


@pytest.mark.parametrize("launcher_block, compiled", [(256, []), (64, [256])])
def test_a_winner_whose_mark_was_lost_is_reused_not_tuned_again(tuning, launcher_block, compiled):
    """A kernel compiled in Inductor's worker pool comes back pickled, and Triton's Config.__setstate__ drops the
    mark: run() then starts tuning. The kernel's own cache holds the winner: it is used instead."""
    cls, tuned = tuning
    before = _kernel(cls, _WINNER, launcher_block)
    before._coordinate_descent_tuning(_Launcher(_Config(launcher_block)))
    assert tuned == [launcher_block]  # (without the mend: tuned again)
    tuned.clear()
    assert coordesc_cache.keep()
    reused = coordesc_cache.counts()["winners_reused"]
    t = _kernel(cls, _WINNER, launcher_block)
    got = t._coordinate_descent_tuning(_Launcher(_Config(launcher_block)))
    assert tuned == [] and got.config.block == 256 and got.config.found_by_coordesc
    assert t.compiled == compiled  # (the winner compiled only where the launcher ran another config)
    assert coordesc_cache.counts()["winners_reused"] == reused + 1


@pytest.mark.parametrize("entry, configs_hash", [
    (None, "h1"),  # nothing cached: the first process tunes
    ({**_WINNER, "found_by_coordesc": False}, "h1"),  # the heuristic pick, not a tuning's winner
    (_WINNER, "h2"),  # a winner among other configs
])
def test_without_a_cached_winner_the_kernel_is_tuned(tuning, entry, configs_hash):
    cls, tuned = tuning
    assert coordesc_cache.keep()
    before = coordesc_cache.counts()["kernels_tuned"]
    t = _kernel(cls, entry, 64, configs_hash)
    assert t._coordinate_descent_tuning(_Launcher(_Config(64))).config.block == 999
    assert tuned == [64] and t.compiled == [] and coordesc_cache.counts()["kernels_tuned"] == before + 1


def _entry(found: bool, configs_hash: str = "h1", block: int = 256) -> bytes:
    return json.dumps({"XBLOCK": block, "num_warps": 4, "num_stages": 1, "configs_hash": configs_hash,
                       "found_by_coordesc": found}).encode()


def test_an_artifacts_unmarked_entry_does_not_replace_a_winner(tmp_path, monkeypatch):
    """Loading an Inductor artifact writes the autotune entries saved in it (torch's own populate_cache, used here)
    over the cache's: an entry saved before the tuning replaced the winner, and every process tuned again."""
    from torch._inductor.runtime import autotune_cache as ac

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    key = "ab/k.best_config"
    kept = tmp_path / key
    kept.parent.mkdir()
    kept.write_bytes(_entry(True))
    stale_one = ac.AutotuneCacheArtifact(key, _entry(False, block=64))
    method = ac.AutotuneCacheArtifact.populate_cache
    getattr(method, "__wrapped__", method)(stale_one)  # torch's own, unmended (mended by an earlier keep() or not)
    assert json.loads(kept.read_bytes())["found_by_coordesc"] is False  # (without the mend: the winner lost)
    kept.write_bytes(_entry(True))
    assert coordesc_cache.keep()
    n = coordesc_cache.counts()["stale_entries_kept_out"]
    stale_one.populate_cache()
    assert kept.read_bytes() == _entry(True) and coordesc_cache.counts()["stale_entries_kept_out"] == n + 1
    ac.AutotuneCacheArtifact(key, _entry(True, block=128)).populate_cache()  # (a winner replaces a winner)
    assert json.loads(kept.read_bytes())["XBLOCK"] == 128
    ac.AutotuneCacheArtifact(key, _entry(False, "h2")).populate_cache()  # (another set of configs: written)
    assert json.loads(kept.read_bytes())["configs_hash"] == "h2"
    ac.AutotuneCacheArtifact("cd/new.best_config", _entry(False)).populate_cache()  # (nothing kept yet: written)
    assert (tmp_path / "cd/new.best_config").read_bytes() == _entry(False)


@pytest.mark.parametrize("kept, new, expected", [
    (_entry(True), _entry(False), True),
    (_entry(True), _entry(True, block=64), False),
    (_entry(False), _entry(False, block=64), False),
    (_entry(True), _entry(False, "h2"), False),
    (b"not json", _entry(False), False),
    (None, _entry(False), False),
])
def test_stale(tmp_path, kept, new, expected):
    path = tmp_path / "k.best_config"
    if kept is not None:
        path.write_bytes(kept)
    assert coordesc_cache.stale(str(path), new) is expected
