"""The contract FastGen v0.1.0 reads a ``kd_wds`` dataset with, checked on a ``shardsmith distill`` build
without FastGen's code (its real loader and KD models were run on such shards outside CI).

What FastGen's code does (NVlabs/FastGen 34f30e8, setup.py version 0.1.0; the same lines in
juliusberner/FastGen 123e6a2):

- ``fastgen/configs/data.py:71``: ``PairLoaderConfig`` ``key_map={"real": "latent.pth", "noise": "noise.pth",
  "condition": "txt_emb.pth"}``; ``:81``: ``PathLoaderConfig`` ``key_map={"real": "latent.pth", "path":
  "path.pth", "condition": "txt_emb.pth"}``; both ``batch_size=2``, ``shuffle_size=100``.
- ``fastgen/datasets/wds_utils.py:127``: shards are sorted by ``int(stem)`` (``shard_to_idx``, ``:46``), by
  name when a stem is not a number (``:130``).
- ``fastgen/methods/knowledge_distillation/KD.py``, ``KDModel.single_train_step``:
  one step: the input is ``data["noise"]``, else ``data["path"][:, 0]`` (``:84-87``), at ``t = max_t``;
  several: ``assert denoise_path.shape[1] == 4`` (``:100``), ``shape[1] % student_sample_steps == 0``
  (``:101-103``); ``t_student, t_list_ids = sample_from_t_list(B, sample_steps=steps,
  t_list=config.sample_t_cfg.t_list, return_ids=True)`` (``:105-111``), which draws
  ``ids = torch.randint(0, len(t_list) - 1, (n,))`` (``fastgen/networks/noise_schedule.py:301``: never the
  final t = 0) and returns ``t_list[ids], ids`` (``:303``); then
  ``path_indices = t_list_ids * (denoise_path.shape[1] // self.config.student_sample_steps)`` (``KD.py:115``)
  and ``input_student = torch.gather(denoise_path, 1, path_indices...)`` (``:116-119``).
  The rule: with the student's ``t_list`` of ``steps + 1`` entries, id ``k`` in ``range(steps)`` feeds
  ``path[:, k * (4 // steps)]`` at ``t = t_list[k]``; aligned with our data iff
  ``t_list[k] == path_timesteps[k * 4 // steps]``, i.e. the student's ``t_list`` is the data's
  ``t_list[::4 // steps]`` (steps 4: ``[0.999, 0.937, 0.833, 0.624, 0.0]``, ``configs/experiments/WanT2V/
  config_kd_path.py:24``; steps 2: ``[0.999, 0.833, 0.0]``; steps 2 with all five entries gathers
  ``path[:, 6]`` and fails).
- ``CausalKDModel.single_train_step``: per-chunk ids from ``sample_t_inhom`` (``noise_schedule.py:373``:
  ``torch.randint(0, len(t_list), ...)``, all five entries, t = 0 included), ``denoise_path_all =
  torch.cat([denoise_path, denoised_data.unsqueeze(1)], dim=1)`` (``KD.py:195``), input = the gather of it at
  those ids per frame (``:192-196``): ``real`` is the fifth state, at ``t_list[4] = 0``.

The data's meaning is checked with the exact Gaussian teacher: each state is the exact probability-flow
solution from ``noise`` at its own time (to the solver's error), and nearer to it than to any other
``t_list`` time.
"""

from __future__ import annotations

import json

import pytest
import torch

from shardsmith.distill.gaussian import cond_mean, flow_solution
from shardsmith.formats.wds import KD_INDEX_FILE
from shardsmith.loaders.presets import PRESETS, build_loader, preset_config
from test_distill_verify import FASTGEN_T_LIST, SHAPE, build_kd

pytestmark = pytest.mark.slow  # every test reads the distill build (~7 s, once per session)

FASTGEN_KEY_MAPS = {
    "kd_pair": {"real": "latent.pth", "noise": "noise.pth", "condition": "txt_emb.pth"},  # data.py:71
    "kd_path": {"real": "latent.pth", "path": "path.pth", "condition": "txt_emb.pth"},  # data.py:81
}
SOLVER_TOL = 0.05  # Heun, 8 steps, on the exact Gaussian flow: ~1e-2 at most (the next t_list time: > 0.15)


@pytest.fixture(scope="module")
def kd(tmp_path_factory):
    return build_kd(tmp_path_factory) / "kd"


@pytest.fixture(scope="module")
def index(kd):
    return json.loads((kd / KD_INDEX_FILE).read_text())


@pytest.fixture(scope="module")
def batch(kd):
    """Every sample in one batch, through our loader with both presets' key_maps (same order)."""
    got = {}
    for preset in ("kd_path", "kd_pair"):
        cfg = preset_config(preset, kd, deterministic=True, partial=True, batch_size=64, num_workers=0)
        b = next(iter(build_loader(cfg)))
        if got:
            assert b["__key__"] == got["__key__"]
        got.update(b)
    return got


def _exact(batch, index, t):
    """The exact teacher state at time ``t`` from each sample's noise and condition."""
    x = flow_solution(batch["noise"].double(), index["t_list"][0], t, cond_mean(batch["condition"]).double())
    return x.float()


def _is_state_at(x, batch, index, k):
    """``x`` [B, *shape] is the teacher's state at ``t_list[k]``: within the solver's error of the exact one,
    and nearer to it than to the state at any other time of ``t_list``."""
    errs = [(x - _exact(batch, index, t)).abs().amax().item() for t in index["t_list"]]
    return errs[k] < SOLVER_TOL and min(range(len(errs)), key=errs.__getitem__) == k


def test_our_presets_have_fastgens_key_maps():
    for name, km in FASTGEN_KEY_MAPS.items():
        d = PRESETS[name].defaults
        assert d["key_map"] == km and d["batch_size"] == 2 and d["shuffle_size"] == 100
        assert PRESETS[name].fastgen == {"kd_pair": "PairLoaderConfig", "kd_path": "PathLoaderConfig"}[name]


@pytest.mark.parametrize("preset", ["kd_pair", "kd_path"])
@pytest.mark.parametrize("world, workers", [(1, 0), (2, 2), (3, 2)])
def test_our_loader_reads_every_sample_once_over_ranks_x_workers(kd, index, preset, world, workers):
    seen = []
    for rank in range(world):
        cfg = preset_config(preset, kd, deterministic=True, partial=True, rank=rank, world_size=world,
                            num_workers=workers)
        for b in build_loader(cfg):
            n = len(b["__key__"])
            seen += [f"{s}/{k}" for s, k in zip(b["__shard__"], b["__key__"])]
            assert set(b) - {"__key__", "__shard__"} == set(FASTGEN_KEY_MAPS[preset])
            assert list(b["real"].shape) == [n, *SHAPE]
            assert b["condition"].ndim == 3 and b["condition"].shape[0] == n  # [B, L, D]
            if preset == "kd_path":
                assert list(b["path"].shape) == [n, 4, *SHAPE]
            else:
                assert list(b["noise"].shape) == [n, *SHAPE]
    assert sorted(seen) == sorted(f"{s}/{k}" for s, k, _ in index["samples"])  # each exactly once
    assert len(seen) == index["count"] == 8


def test_path_holds_four_states_at_fastgens_default_t_list(batch, index):
    assert index["t_list"] == FASTGEN_T_LIST and index["path_timesteps"] == FASTGEN_T_LIST[:-1]
    assert batch["path"].shape[1] == 4 == len(index["t_list"]) - 1  # KD.py:100
    for k in range(4):
        assert _is_state_at(batch["path"][:, k], batch, index, k), k
    # one step (KD.py:84-87): noise, or path[:, 0], at max_t = t_list[0]: the same tensor (flow start state)
    assert torch.equal(batch["path"][:, 0], batch["noise"])


def _kd_input(path: torch.Tensor, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """KD.py:115-119, restated: ``gather(path, 1, ids * (path.shape[1] // steps))``."""
    idx = ids * (path.shape[1] // steps)
    idx = idx.view(-1, *([1] * (path.ndim - 1))).expand(-1, 1, *path.shape[2:])
    return torch.gather(path, 1, idx).squeeze(1)


@pytest.mark.parametrize("steps", [2, 4])
def test_kdmodel_rule_feeds_the_teacher_state_at_its_time(batch, index, steps):
    path, pts = batch["path"], index["path_timesteps"]
    assert path.shape[1] % steps == 0  # KD.py:101-103
    t_student = index["t_list"][:: 4 // steps]  # the student's t_list: steps + 1 entries
    assert len(t_student) == steps + 1 and t_student[-1] == 0.0
    for k in range(len(t_student) - 1):  # every id randint(0, len(t_list) - 1) draws (noise_schedule.py:301)
        x = _kd_input(path, torch.full((path.shape[0],), k), steps)
        j = k * 4 // steps
        assert torch.equal(x, path[:, j])
        assert t_student[k] == pts[j]  # the time FastGen gives it is the time index.json says the state is at
        assert _is_state_at(x, batch, index, index["t_list"].index(t_student[k]))
    # all five entries with two steps: ids up to 3 gather path[:, 6], past the 4 states
    assert 3 * (path.shape[1] // 2) >= path.shape[1]


def test_causal_kd_appends_real_as_the_fifth_state_at_t_0(batch, index):
    path, real = batch["path"], batch["real"]
    states = torch.cat([path, real.unsqueeze(1)], dim=1)  # KD.py:195
    assert states.shape[1] == 5 == len(index["t_list"])
    for k in range(5):
        assert _is_state_at(states[:, k], batch, index, k), k
    # the per-frame gather (KD.py:192-196) with ids over all five entries (noise_schedule.py:373)
    frames = path.shape[3]
    ids = torch.arange(path.shape[0] * frames).remainder(5).view(path.shape[0], frames)
    assert set(ids.flatten().tolist()) == set(range(5))
    idx = ids.view(ids.shape[0], 1, 1, frames, *([1] * max(0, path.ndim - 4))).expand(-1, -1, *path.shape[2:])
    x = torch.gather(states, 1, idx).squeeze(1)
    for b in range(path.shape[0]):
        for f in range(frames):
            assert torch.equal(x[b, :, f], states[b, ids[b, f], :, f])


def test_shard_names_are_numeric_and_sort_the_same_as_numbers_and_as_strings(kd, index):
    names = [p.name for p in kd.iterdir() if p.suffix == ".tar"]
    assert names and all(n.removesuffix(".tar").isdigit() for n in names)
    by_number = sorted(names, key=lambda n: int(n.removesuffix(".tar")))  # wds_utils.py:127
    assert by_number == sorted(names)  # wds_utils.py:130's fallback would give the same order
    listed = list(dict.fromkeys(s for s, _, _ in index["samples"]))
    assert listed == by_number  # index.json's samples in shard order
