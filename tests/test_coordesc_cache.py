"""Coordinate-descent winners reused across processes where torch loses them (shardsmith.encode.coordesc_cache):
the bug's shape (pytorch/pytorch#172819) reproduced on stand-ins, since Triton kernels need a GPU."""

from __future__ import annotations

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


def test_a_fixed_torch_is_left_as_it_is():
    """This machine's torch has the fix: nothing is wrapped."""
    from torch._inductor.runtime import triton_heuristics as th

    before = th.CachingAutotuner.recheck_autotune_cache
    assert not coordesc_cache.has_bug(before)
    assert coordesc_cache.keep() is False and th.CachingAutotuner.recheck_autotune_cache is before
    assert coordesc_cache.has_bug(_Buggy.recheck_autotune_cache)


def test_without_its_source_the_torch_version_decides(monkeypatch):
    def unreadable(obj):
        raise OSError("could not get source code")

    monkeypatch.setattr(coordesc_cache.inspect, "getsource", unreadable)
    assert coordesc_cache.has_bug(_Buggy.recheck_autotune_cache, "2.11.0+cu130")
    assert not coordesc_cache.has_bug(_Buggy.recheck_autotune_cache, "2.12.1")
    assert not coordesc_cache.has_bug(_Buggy.recheck_autotune_cache, "2.13.0+cpu")
