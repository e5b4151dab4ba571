"""Camera tracks tied to their target's geometry (issue 18, camera-video): sampled at the target's frames,
intrinsics moved onto the output pixels by the target's resize and crop, so that 3-D points project where
the resized and cropped frames show them; bad tracks fail the item, naming it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardsmith.records import ItemError
from shardsmith.transform.buckets import Bucket
from shardsmith.transform.camera import LAYOUT, CameraTrack, adjust_intrinsics, camera_for, load_camera
from shardsmith.transform.geometry import decide
from shardsmith.transform.video import resize_crop_frames

W, H = 320, 240
K = (260.0, 250.0, 161.0, 118.5)  # fx, fy, cx, cy in source pixels (corner convention)


def _rot_y(deg: float) -> np.ndarray:
    a = np.deg2rad(deg)
    return np.array([[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]])


def _path(n: int) -> np.ndarray:
    """A moving camera: ``n`` world-to-camera 4x4 matrices, turning 0.4 degrees and stepping sideways,
    down and back a little per frame."""
    out = np.zeros((n, 4, 4))
    for i in range(n):
        r = _rot_y(0.4 * i)
        c = np.array([0.03 * i, -0.015 * i, -0.05 * i])  # camera centre in the world
        out[i, :3, :3], out[i, :3, 3], out[i, 3, 3] = r, -r @ c, 1.0
    return out


POINTS = np.array([[x, y, z] for x, z in ((-0.6, 5.0), (0.0, 4.0), (0.6, 6.0)) for y in (-0.4, 0.4)])


def _project(ext: np.ndarray, k, pts: np.ndarray) -> np.ndarray:
    """Pixel coordinates ``[P, 2]`` of world points through one world-to-camera matrix and (fx, fy, cx, cy)."""
    cam = pts @ ext[:3, :3].T + ext[:3, 3]
    fx, fy, cx, cy = k
    return np.stack([fx * cam[:, 0] / cam[:, 2] + cx, fy * cam[:, 1] / cam[:, 2] + cy], axis=1)


def _track(n: int = 12) -> CameraTrack:
    return CameraTrack(_path(n), np.tile(np.array(K), (n, 1)), (W, H))


def test_intrinsics_after_resize_and_crop_match_a_hand_computation():
    # 640x480 into a 256x256 bucket: scale max(256/640, 256/480) = 0.5333 -> resize 341x256, crop x0 = 42
    geom = decide(640, 480, Bucket(256, 256, 1))
    assert geom.resize == (341, 256) and geom.crop == (42, 0, 298, 256)
    k = np.array([[500.0, 510.0, 320.0, 240.0]])
    want = [500 * 341 / 640, 510 * 256 / 480, 320 * 341 / 640 - 42, 240 * 256 / 480 - 0]
    assert want == [266.40625, 272.0, 128.5, 128.0]
    assert np.allclose(adjust_intrinsics(k, (640, 480), geom), [want], rtol=0, atol=1e-12)
    # intrinsics given for another size of the same shape (1280x960) are rescaled to the source first
    assert np.allclose(adjust_intrinsics(k * 2, (1280, 960), geom), [want], rtol=0, atol=1e-12)
    # a portrait source into a landscape bucket crops y: 300x400 -> 192x128: resize 192x256, crop y0 = 64
    geom = decide(300, 400, Bucket(192, 128, 1))
    assert geom.resize == (192, 256) and geom.crop == (0, 64, 192, 192)
    got = adjust_intrinsics(np.array([[300.0, 300.0, 150.0, 200.0]]), (300, 400), geom)
    assert np.allclose(got, [[300 * 192 / 300, 300 * 256 / 400, 150 * 192 / 300, 200 * 256 / 400 - 64]])

    row = camera_for(CameraTrack(np.eye(4)[None], k, (640, 480)), decide(640, 480, Bucket(256, 256, 1)), 1, "i")
    assert row.shape == (1, 20) and row.dtype == np.float32 and len(LAYOUT) == 20
    assert np.array_equal(row[0, :16], np.eye(4).ravel()) and np.allclose(row[0, 16:], want)


def test_points_project_where_the_resized_and_cropped_frames_put_them():
    track = _track(12)
    geom = decide(W, H, Bucket(128, 128, 5), frame_indices=[1, 3, 5, 7, 10], fps=12.0)
    cam = camera_for(track, geom, 12, "s/cam")
    assert cam.shape == (5, 20)
    (rw, rh), (x0, y0) = geom.resize, geom.crop[:2]
    for k, i in enumerate(geom.frame_indices):
        assert np.array_equal(cam[k, :16], track.extrinsics[i].ravel().astype(np.float32))  # the frame's own camera
        # by hand: project with the original K in the source frame, scale by the resize, shift by the crop
        src = _project(track.extrinsics[i], K, POINTS)
        by_hand = src * [rw / W, rh / H] - [x0, y0]
        adjusted = _project(cam[k, :16].reshape(4, 4).astype(np.float64), cam[k, 16:].astype(np.float64), POINTS)
        assert np.allclose(adjusted, by_hand, atol=1e-3)


def _render(track: CameraTrack, sigma: float = 2.5) -> np.ndarray:
    """uint8 ``[N, H, W, 3]`` frames with a Gaussian dot where each of :data:`POINTS` projects (pixel
    centres at i + 0.5: the corner convention the intrinsics use)."""
    yy, xx = np.mgrid[0:H, 0:W] + 0.5
    frames = np.zeros((len(track), H, W), np.float64)
    for i in range(len(track)):
        for u, v in _project(track.extrinsics[i], track.intrinsics[i], POINTS):
            frames[i] += np.exp(-((xx - u) ** 2 + (yy - v) ** 2) / (2 * sigma**2))
    g = np.clip(np.round(frames * 255), 0, 255).astype(np.uint8)
    return np.repeat(g[..., None], 3, axis=3)


def _centroid(img: np.ndarray, near: np.ndarray, r: int = 4) -> np.ndarray:
    """The intensity centroid (pixel centres at i + 0.5) of the dot near ``near``, re-centred 4 times."""
    c = np.asarray(near, dtype=np.float64)
    for _ in range(4):
        x, y = int(np.floor(c[0])), int(np.floor(c[1]))
        win = img[y - r:y + r + 1, x - r:x + r + 1].astype(np.float64)
        yy, xx = np.mgrid[y - r:y + r + 1, x - r:x + r + 1] + 0.5
        c = np.array([(win * xx).sum(), (win * yy).sum()]) / win.sum()
    return c


def test_dots_in_the_resized_pixels_sit_where_the_adjusted_camera_projects_them():
    # real pixels: dots drawn where the points project in 320x240 frames, put through the target's PIL
    # bicubic resize (0.5333x) and crop, then found again; the adjusted camera must predict them to a
    # small fraction of a pixel (OpenCV's pixel-centre origin would be off by 0.5 (1 - s) = 0.23 px)
    track = _track(12)
    geom = decide(W, H, Bucket(128, 128, 5), frame_indices=[0, 2, 4, 8, 11], fps=12.0)
    frames = resize_crop_frames(_render(track)[list(geom.frame_indices)], geom)
    cam = camera_for(track, geom, 12, "s/cam")
    s = geom.resize[0] / W
    worst = 0.0
    for k in range(len(frames)):
        predicted = _project(cam[k, :16].reshape(4, 4).astype(np.float64), cam[k, 16:].astype(np.float64), POINTS)
        for p in predicted:
            assert 6 <= p[0] <= 122 and 6 <= p[1] <= 122  # every dot well inside the output
            worst = max(worst, float(np.abs(_centroid(frames[k, :, :, 0], p) - p).max()))
        # the other convention's prediction misses by the half-pixel term
        other = predicted + 0.5 * (s - 1)
        assert np.abs(_centroid(frames[k, :, :, 0], other[0]) - other[0]).max() > 0.15
    assert worst < 0.05, worst


def test_a_track_of_another_length_or_shape_is_refused():
    geom = decide(W, H, Bucket(128, 128, 5), frame_indices=[0, 1, 2, 3, 4], fps=12.0)
    with pytest.raises(ItemError) as e:
        camera_for(_track(10), geom, 12, "s/cam7")
    assert e.value.reason == "camera_length_mismatch"
    assert "10" in e.value.detail and "12" in e.value.detail and "s/cam7" in e.value.detail
    short = decide(W, H, Bucket(128, 128, 5), frame_indices=[6, 7, 8, 9, 10], fps=12.0)
    with pytest.raises(ItemError) as e:
        camera_for(_track(10), short, 10, "s/cam7")  # the clip's own count agrees but the picks run past it
    assert e.value.reason == "camera_length_mismatch"
    wide = CameraTrack(_path(12), np.tile(np.array(K), (12, 1)), (320, 180))
    with pytest.raises(ItemError) as e:
        camera_for(wide, geom, 12, "s/cam7")
    assert e.value.reason == "camera_geometry_mismatch"
    # a still target takes the track's only camera
    still = camera_for(_track(1), decide(W, H, Bucket(128, 128, 1)), 1, "s/img")
    assert still.shape == (1, 20)


# ----------------------------------------------------------------------------- files


def _k3(k) -> list:
    fx, fy, cx, cy = k
    return [[fx, 0, cx], [0, fy, cy], [0, 0, 1]]


def test_json_npz_and_npy_tracks_load_the_same(tmp_path):
    ext = _path(6)
    want = CameraTrack(ext, np.tile(np.array(K), (6, 1)), (W, H))
    forms = {
        "a.json": {"width": W, "height": H, "frames": [{"extrinsic": e.tolist(), "intrinsic": list(K)} for e in ext]},
        "b.json": {"width": W, "height": H, "frames": [{"extrinsic": e[:3].tolist(), "intrinsic": _k3(K)} for e in ext]},
        "c.json": {"width": W, "height": H, "intrinsic": list(K), "frames": [{"extrinsic": e[:3].tolist()} for e in ext]},
    }
    for name, doc in forms.items():
        (tmp_path / name).write_text(json.dumps(doc))
    np.savez(tmp_path / "d.npz", extrinsics=ext[:, :3], intrinsics=np.array(K), size=np.array([W, H]))
    np.savez(tmp_path / "e.npz", extrinsics=ext, intrinsics=np.array([_k3(K)] * 6), size=np.array([W, H]))
    rec = np.zeros(6, dtype=[("extrinsic", "f8", (3, 4)), ("intrinsic", "f8", (4,)), ("width", "i4"),
                             ("height", "i4")])
    rec["extrinsic"], rec["intrinsic"], rec["width"], rec["height"] = ext[:, :3], K, W, H
    np.save(tmp_path / "f.npy", rec)
    for name in ("a.json", "b.json", "c.json", "d.npz", "e.npz", "f.npy"):
        t = load_camera(tmp_path / name, "s/x")
        assert t.size == (W, H) and len(t) == 6, name
        assert t.extrinsics.dtype == np.float64 and t.extrinsics.shape == (6, 4, 4), name
        assert np.array_equal(t.extrinsics, want.extrinsics), name  # 3x4 completed with 0 0 0 1
        assert np.array_equal(t.intrinsics, want.intrinsics), name


def _frames(n=3, **override):
    fr = [{"extrinsic": np.eye(4).tolist(), "intrinsic": [100, 100, 50, 40]} for _ in range(n)]
    for f in fr:
        f.update(override)
    return fr


@pytest.mark.parametrize("name,content,reason", [
    ("missing.json", None, "camera_unreadable"),
    ("bad.json", "{not json", "camera_unreadable"),
    ("cam.txt", "1 2 3", "camera_unreadable"),
    ("bad.npz", "garbage", "camera_unreadable"),
    ("bad.npy", "garbage", "camera_unreadable"),
    ("list.json", [1, 2], "camera_bad_shape"),
    ("noframes.json", {"width": 100, "height": 80}, "camera_bad_shape"),
    ("nosize.json", {"frames": _frames()}, "camera_bad_shape"),
    ("zerosize.json", {"width": 0, "height": 80, "frames": _frames()}, "camera_bad_shape"),
    ("floatsize.json", {"width": 100.5, "height": 80, "frames": _frames()}, "camera_bad_shape"),
    ("noext.json", {"width": 100, "height": 80, "frames": [{"intrinsic": [1, 1, 1, 1]}]}, "camera_bad_shape"),
    ("noint.json", {"width": 100, "height": 80, "frames": [{"extrinsic": np.eye(4).tolist()}]}, "camera_bad_shape"),
    ("ext33.json", {"width": 100, "height": 80, "frames": _frames(extrinsic=np.eye(3).tolist())}, "camera_bad_shape"),
    ("row.json", {"width": 100, "height": 80, "frames": _frames(extrinsic=(np.eye(4) * 2).tolist())},
     "camera_bad_shape"),
    ("words.json", {"width": 100, "height": 80, "frames": _frames(extrinsic="eye")}, "camera_bad_shape"),
    ("ragged.json", {"width": 100, "height": 80,
                     "frames": _frames(1) + _frames(1, extrinsic=np.eye(4)[:3].tolist())}, "camera_bad_shape"),
    ("fx0.json", {"width": 100, "height": 80, "frames": _frames(intrinsic=[0, 100, 50, 40])}, "camera_bad_shape"),
    ("skew.json", {"width": 100, "height": 80, "frames": _frames(intrinsic=[[100, 2, 50], [0, 100, 40], [0, 0, 1]])},
     "camera_bad_shape"),
    ("k5.json", {"width": 100, "height": 80, "frames": _frames(intrinsic=[1, 2, 3])}, "camera_bad_shape"),
    ("nan.npz", "nan", "camera_bad_shape"),
    ("nokey.npz", "nokey", "camera_bad_shape"),
    ("plain.npy", "plain", "camera_bad_shape"),
])
def test_bad_camera_files_are_refused_naming_the_item_and_file(tmp_path, name, content, reason):
    p = tmp_path / name
    if content == "garbage":
        p.write_bytes(b"\x00garbage\xff")
    elif content == "nan":
        ext = np.tile(np.eye(4), (2, 1, 1))
        ext[1, 0, 3] = np.nan
        np.savez(p, extrinsics=ext, intrinsics=np.array([100.0, 100, 50, 40]), size=np.array([100, 80]))
    elif content == "nokey":
        np.savez(p, extrinsics=np.tile(np.eye(4), (2, 1, 1)), size=np.array([100, 80]))
    elif content == "plain":
        np.save(p, np.tile(np.eye(4), (2, 1, 1)))
    elif isinstance(content, str):
        p.write_text(content)
    elif content is not None:
        p.write_text(json.dumps(content))
    with pytest.raises(ItemError) as e:
        load_camera(p, "src/item9")
    assert e.value.reason == reason, e.value.detail
    assert "src/item9" in e.value.detail and name in e.value.detail
