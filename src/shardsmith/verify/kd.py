"""The knowledge-distillation checks of ``verify`` (presets ``kd_pair`` and ``kd_path``): every sample's
pair and trajectory against each other and against the dataset's ``index.json``.

Contract
- In: a WebDataset folder of ``kd_wds`` samples (``txt_emb.pth``, ``noise.pth``, ``latent.pth``,
  ``path.pth``, ``json``), the preset verify reads it with, its ``ignore_index.json`` entries and
  verify's ``check(name, ok, detail)``.
- Reads each sample's tensors once, one sample at a time, through the loader's own shard listing and
  reader (``loaders.shard_reader``, ``loaders.pth_fast``); writes nothing.
- Adds these checks; each failure names ``shard/key`` (or the field of ``index.json``) and what is
  wrong, the first few in the detail; ``check_kd`` returns them all (``report["kd"]``):
  - ``kd_index``: ``index.json`` agrees with the shards: ``count`` is the number of samples it lists
    and of samples the shards hold; every ``[shard, key]`` it lists is in the shards exactly once, and
    every sample of the shards is listed exactly once; ``path_timesteps == t_list[:-1]``. A sample a
    repair removed (``repair.json``) may be listed and absent. Without ``index.json`` (a dataset
    shardsmith did not write, or one whose ``format`` is not ``shardsmith-kd``) it passes, saying
    FastGen's rule stands in for it.
  - ``kd_seeds`` (with ``index.json``): each sample's ``json`` member's ``seed`` is index.json's.
  - ``kd_states``: ``path.pth`` holds ``len(t_list) - 1`` states (without ``index.json``: 4, as
    FastGen's ``KDModel`` asserts); a sample lacks ``path.pth`` only where index.json's ``has_path``
    is false (without index.json: where the preset is ``kd_pair``).
  - ``kd_shapes``: ``path.shape[1:] == latent.shape == noise.shape`` (those the sample has), equal to
    index.json's ``shape``, in its ``dtype``; a member that does not load as one tensor fails here.
  - ``kd_finite``: no NaN or Inf in ``noise.pth``, ``latent.pth``, ``path.pth``.
- Samples ``ignore_index.json`` names (the loader skips them) are left out of the per-sample checks
  but count as present for ``kd_index``.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from shardsmith.atomic import loads_json
from shardsmith.formats.kd import KD_FORMAT, read_kd_index
from shardsmith.formats.wds import JSON, KD_INDEX_FILE, LATENT, NOISE, PATH

KD_PRESETS = ("kd_pair", "kd_path")
#: path states FastGen's KDModel asserts (``denoise_path.shape[1] == 4``): the rule without index.json
FASTGEN_STATES = 4
CHECKS = ("kd_index", "kd_seeds", "kd_states", "kd_shapes", "kd_finite")
SHOWN = 5  # failures shown in a check's detail
KEPT = 200  # failures kept per check in the report


def check_kd(folder: Path, preset: str, ignore: dict[str, list[str]],
             check: Callable[[str, bool, str], None]) -> dict[str, Any]:
    """Run the checks of the module docstring on ``folder``; return ``{"index", "t_list",
    "expected_states", "samples", "problems": {check: [message, ...]}}``."""
    from shardsmith.loaders.shard_reader import list_shards, shard_samples

    folder = Path(folder)
    problems: dict[str, list[str]] = {c: [] for c in CHECKS}
    try:
        index = read_kd_index(folder)
    except (OSError, ValueError) as exc:
        check("kd_index", False, f"{KD_INDEX_FILE} cannot be read: {exc}")
        return {"index": None, "problems": {"kd_index": [str(exc)]}}
    foreign = None
    if index is not None and (not isinstance(index, dict) or index.get("format") != KD_FORMAT):
        foreign, index = (index.get("format") if isinstance(index, dict) else type(index).__name__), None
    t_list = index.get("t_list") if index else None
    if index and not (isinstance(t_list, list) and len(t_list) >= 2):
        problems["kd_index"].append(f"{KD_INDEX_FILE}: t_list {t_list!r} is not a list of 2 or more times")
        t_list = None
    expected = len(t_list) - 1 if t_list else FASTGEN_STATES
    # True: every sample has path.pth; False: none has; None: either (kd_pair without index.json)
    need_path = bool(index.get("has_path", True)) if index else (True if preset == "kd_path" else None)
    shape, dtype = (index.get("shape"), index.get("dtype")) if index else (None, None)
    seeds: dict[tuple[str, str], Any] = {}
    listed: Counter = Counter()
    if index:
        for i, entry in enumerate(index.get("samples") or []):
            if not (isinstance(entry, list) and len(entry) == 3):
                problems["kd_index"].append(f"{KD_INDEX_FILE}: samples[{i}] is not [shard, key, seed]: {entry!r}"[:200])
                continue
            shard, key, seed = entry
            listed[(shard, key)] += 1
            seeds[(shard, key)] = seed

    held: Counter = Counter()
    n = 0
    for shard in list_shards(folder):
        skip = set(ignore.get(shard, ()))
        samples = shard_samples(folder / shard)
        fd = os.open(folder / shard, os.O_RDONLY)
        try:
            for key, members in samples:
                held[(shard, key)] += 1
                if key in skip:
                    continue
                n += 1
                _check_sample(fd, f"{shard}/{key}", members, expected, need_path, shape, dtype,
                              seeds.get((shard, key)) if index else None, problems)
        finally:
            os.close(fd)

    if index:
        _index_agrees(folder, index, listed, held, problems["kd_index"])
    absent = f"no {KD_INDEX_FILE} (a dataset shardsmith did not write)" if foreign is None else \
        f"{KD_INDEX_FILE} is not shardsmith's (format {foreign!r})"
    where = f"{KD_INDEX_FILE}'s t_list {t_list}" if index else f"{absent}: FastGen's rule"
    ok_lines = {
        "kd_index": (f"{KD_INDEX_FILE} lists the {sum(held.values())} sample(s) the shards hold, each once; "
                     f"path_timesteps == t_list[:-1]") if index else
                    f"{absent}: path states checked by FastGen's rule ({FASTGEN_STATES})",
        "kd_seeds": f"each sample's json seed is {KD_INDEX_FILE}'s",
        "kd_states": f"each of the {n} sample(s) has {expected} path state(s) ({where})" if need_path else
                     f"no sample has path.pth ({KD_INDEX_FILE} has_path: false)" if need_path is False else
                     f"path.pth, where a sample has it, holds {expected} state(s) ({where})",
        "kd_shapes": "path.shape[1:] == latent.shape == noise.shape" + (f" == {shape} ({dtype})" if index else "")
                     + f" in each of the {n} sample(s)",
        "kd_finite": f"no NaN or Inf in the noise, latent and path of the {n} sample(s)",
    }
    for name in CHECKS:
        if name == "kd_seeds" and not index:
            continue
        bad = problems[name]
        if bad:
            more = "; ..." if len(bad) > SHOWN else ""
            check(name, False, f"{len(bad)} problem(s): " + "; ".join(bad[:SHOWN]) + more)
        else:
            check(name, True, ok_lines[name])
    return {"index": KD_INDEX_FILE if index else None, "t_list": t_list, "expected_states": expected,
            "samples": n, "problems": {k: v[:KEPT] for k, v in problems.items() if v}}


def _check_sample(fd: int, sid: str, members: dict, expected: int, need_path: bool | None, shape, dtype,
                  seed, problems: dict[str, list[str]]) -> None:
    """The per-sample checks of one sample ``sid`` (``shard/key``), appending to ``problems``."""
    import torch

    from shardsmith.loaders.pth_fast import load_pth_bytes
    from shardsmith.loaders.shard_reader import read_member

    if seed is not None:
        if JSON not in members:
            problems["kd_seeds"].append(f"{sid}: no json member (index.json says seed {seed})")
        else:
            member = f"{sid.rpartition('/')[2]}.{JSON}"
            try:
                meta = loads_json(bytes(read_member(fd, members[JSON], sid)))
            except ValueError as exc:  # (not UTF-8, not JSON, nested too deep: a damaged record, not a traceback)
                problems["kd_seeds"].append(f"{sid}: member {member} is not valid JSON ({exc}), so its seed cannot "
                                            f"be checked (index.json says {seed})"[:300])
            else:
                if not isinstance(meta, dict):
                    problems["kd_seeds"].append(f"{sid}: member {member} holds a JSON {type(meta).__name__}, not an "
                                                f"object with a seed (index.json says {seed})")
                elif meta.get("seed") != seed:
                    problems["kd_seeds"].append(f"{sid}: json seed {meta.get('seed')}, index.json says {seed}")
    tensors: dict[str, Any] = {}
    for suffix in (NOISE, LATENT, PATH):
        if suffix not in members:
            continue
        try:
            t = load_pth_bytes(read_member(fd, members[suffix], sid, writable=True))
        except Exception as exc:  # noqa: BLE001 - every load failure is reported, not raised
            problems["kd_shapes"].append(f"{sid}: {suffix} does not load ({type(exc).__name__}: {exc})"[:300])
            continue
        if not isinstance(t, torch.Tensor):
            problems["kd_shapes"].append(f"{sid}: {suffix} holds a {type(t).__name__}, not a tensor")
            continue
        tensors[suffix] = t
        if t.is_floating_point() or t.is_complex():
            nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
            if nan or inf:
                problems["kd_finite"].append(f"{sid}: {suffix} holds {nan} NaN and {inf} Inf value(s)")
        if dtype is not None and str(t.dtype).removeprefix("torch.") != dtype:
            problems["kd_shapes"].append(f"{sid}: {suffix} is {str(t.dtype).removeprefix('torch.')}, "
                                         f"index.json says {dtype}")
    path = tensors.get(PATH)
    if PATH not in members and need_path:
        problems["kd_states"].append(f"{sid}: no path.pth")
    elif PATH in members and need_path is False:
        problems["kd_states"].append(f"{sid}: has path.pth, but index.json says has_path: false")
    if path is not None:
        if path.ndim < 1 or path.shape[0] != expected:
            problems["kd_states"].append(f"{sid}: path.pth holds {path.shape[0] if path.ndim else 0} state(s) "
                                         f"(shape {list(path.shape)}), {expected} expected")
    shapes = {s: list(t.shape[1:] if s == PATH else t.shape) for s, t in tensors.items()}
    if len({tuple(v) for v in shapes.values()}) > 1:
        problems["kd_shapes"].append(f"{sid}: shapes differ: " + ", ".join(
            f"{'path.shape[1:]' if s == PATH else s} {v}" for s, v in shapes.items()))
    elif shape is not None and shapes and next(iter(shapes.values())) != list(shape):
        problems["kd_shapes"].append(f"{sid}: sample shape {next(iter(shapes.values()))}, "
                                     f"index.json says {list(shape)}")


def _index_agrees(folder: Path, index: dict, listed: Counter, held: Counter, bad: list[str]) -> None:
    """``kd_index``: index.json's fields and listing against the samples the shards hold."""
    t_list, steps = index.get("t_list") or [], index.get("path_timesteps")
    if steps != t_list[:-1]:
        bad.append(f"{KD_INDEX_FILE}: path_timesteps {steps} is not t_list[:-1] {t_list[:-1]}")
    count, n_listed = index.get("count"), sum(listed.values())
    if count != n_listed:
        bad.append(f"{KD_INDEX_FILE}: count {count}, but it lists {n_listed} sample(s)")
    removed = _repair_removed(folder)
    for (shard, key), c in listed.items():
        if c > 1:
            bad.append(f"{shard}/{key}: listed {c} times in {KD_INDEX_FILE}")
        if (shard, key) not in held and (shard, key) not in removed:
            bad.append(f"{shard}/{key}: listed in {KD_INDEX_FILE}, not in the shards")
    for (shard, key), c in held.items():
        if c > 1:
            bad.append(f"{shard}/{key}: in its shard {c} times")
        if (shard, key) not in listed:
            bad.append(f"{shard}/{key}: in the shards, not listed in {KD_INDEX_FILE}")
    n_held = sum(held.values()) + sum(1 for k in removed if k in listed and k not in held)
    if count != n_held:
        bad.append(f"{KD_INDEX_FILE}: count {count}, but the shards hold {sum(held.values())} sample(s)"
                   + (f" (+ {n_held - sum(held.values())} removed by repair)" if n_held != sum(held.values()) else ""))


def _repair_removed(folder: Path) -> set[tuple[str, str]]:
    """``(shard, key)`` of the samples repairs removed and recorded in repair.json (none when it is unreadable:
    verify's ``repair_log`` check says so)."""
    from shardsmith.verify.repair import RepairError, repair_losses

    try:
        return {(x.shard, x.key) for x in repair_losses(folder) if x.key is not None}
    except RepairError:
        return set()
