"""What a build writes under an item's name is that item's: ``.precomputed/`` files of two items that
mirror to one path (``x.jpg`` and ``x.png``, two table rows of one clip) get unique names decided from
the plan (the same on a resume), paired across every folder; a source name that is no folder name is
refused; a partner file (reference, edit source, mask, camera) is read as the plan hashed it, so one
changed since the plan fails its item as ``<role>_changed_since_plan`` and one gone as
``<role>_vanished`` instead of writing another file's latents or a traceback; camera rows float32
cannot hold and audio masks decoded from NaN samples fail their item instead of being written as inf,
0 or an all-zero mask."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from media_factory import source_photo
from shardsmith import build as build_mod
from shardsmith import formats
from shardsmith.build import build
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import recipe_from_dict
from shardsmith.records import ItemError, MediaRef, PlannedItem
from shardsmith.transform.buckets import parse_buckets
from shardsmith.transform.geometry import decide
from shardsmith.transform.partners import ConditionCutter, PartnerCutter
from test_build import tree_bytes
from test_cli_mistakes import assert_message, invoke
from video_factory import pan_video

FPS = 24


def _photo(name: str, size: int = 64) -> Image.Image:
    return source_photo(name).convert("RGB").resize((size, size))


def _pt_names(tree: Path, folder: str) -> list[str]:
    return formats.precomputed.cache_files(tree, folder) if (tree / folder).is_dir() else []


def _digest_name(stem: str, item_id: str) -> str:
    """``<stem>_<8 hex>.pt``: the digest :func:`shardsmith.formats.unique_key` gives ``item_id``."""
    return f"{stem}{formats.unique_key('', item_id)}.pt"


def _camera_json(path: Path, frames: int, fx: float = 80.0, tx: float = 0.1) -> Path:
    track = []
    for k in range(frames):
        ext = np.eye(4)
        ext[0, 3] = tx * k
        track.append({"extrinsic": ext.tolist()})
    path.write_text(json.dumps({"width": 64, "height": 64, "intrinsic": [fx, 80.0, 32.0, 32.0], "frames": track}))
    return path


@pytest.mark.parametrize("fx, tx, what", [(80.0, 1e300, "e03"), (1e40, 0.1, "fx"), (3e38, 0.1, "fx"),
                                          (1e-300, 0.1, "fx")])
def test_camera_values_float32_cannot_hold_fail_the_item(tmp_path, fx, tx, what):
    from shardsmith.transform.camera import camera_for, load_camera

    track = load_camera(_camera_json(tmp_path / "cam.json", 3, fx=fx, tx=tx), "s/t")  # finite in float64: loads
    # 64x64 -> 128x128 bucket: the resize doubles fx (3e38 -> 6e38, past float32's 3.4e38)
    geom = decide(64, 64, parse_buckets(["128x128x3"])[0], frame_indices=[0, 1, 2], fps=FPS)
    with pytest.raises(ItemError) as e:
        camera_for(track, geom, 3, "s/t")
    assert e.value.reason == "camera_bad_shape" and what in e.value.detail and "float32" in e.value.detail
    ok = camera_for(load_camera(_camera_json(tmp_path / "ok.json", 3), "s/t"), geom, 3, "s/t")
    assert ok.dtype == np.float32 and np.isfinite(ok).all() and (ok[:, 16:18] > 0).all()


def _float_wav(path: Path, samples: np.ndarray, rate: int = 16000) -> Path:
    """A mono IEEE-float (format 3) WAV of ``samples``, written byte by byte as a recorder writes one."""
    data = np.asarray(samples, "<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    path.write_bytes(b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE"
                     + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data)
    return path


def test_an_audio_mask_recording_with_nan_samples_fails_instead_of_masking_nothing(tmp_path):
    from shardsmith.transform.masks import load_audio_mask

    t = np.arange(16000) / 16000
    loud = (0.9 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    got = load_audio_mask(_float_wav(tmp_path / "ok.wav", loud), "s/t", 26, rate=16000, duration=1.0)
    assert got.shape == (26,) and got.sum() > 20  # a loud recording masks (almost) every step
    nan = loud.copy()
    nan[4000:12000] = np.nan
    with pytest.raises(ItemError) as e:
        load_audio_mask(_float_wav(tmp_path / "nan.wav", nan), "s/t", 26, rate=16000, duration=1.0)
    assert e.value.reason == "mask_bad_values" and "NaN" in e.value.detail
