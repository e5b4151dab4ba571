"""Camera tracks tied to their target's geometry (issue 18, ``camera-video``).

:func:`load_camera` reads a track (one camera per source frame); :func:`camera_for` (pure) samples it
at the frames the target takes and moves its intrinsics onto the target's output pixels, so a 3-D
point projects onto the output frame exactly where the resized and cropped pixels show it.

Conventions:

- **Extrinsics** are world-to-camera (``x_cam = R @ x_world + t``), OpenCV axes (x right, y down,
  z forward); given 4x4, or 3x4 (``[R | t]``, completed with the row ``0 0 0 1``).
- **Intrinsics** are ``(fx, fy, cx, cy)`` in pixels of an image of ``size`` = (w, h), with the
  top-left *corner* of the top-left pixel at (0, 0) (pixel centres at i + 0.5; COLMAP's convention):
  pixel coordinate ``u = fx * x / z + cx``. Under it a resize by s maps u to s * u exactly (PIL's
  resize uses the same centre mapping), which is what makes :func:`camera_for` exact. (Intrinsics
  with OpenCV's origin, pixel 0's centre at 0, come out off by 0.5 * (1 - s) px.) No skew.

Accepted files:

- JSON::

      {"width": W, "height": H,
       "intrinsic": [fx, fy, cx, cy] or [[fx, 0, cx], [0, fy, cy], [0, 0, 1]],     (optional: all frames)
       "frames": [{"extrinsic": 4x4 or 3x4 nested lists,
                   "intrinsic": [fx, fy, cx, cy] or 3x3 K}, ...]}                   (per frame, else the top one)

- ``.npz`` (``numpy.savez``, no pickles): ``extrinsics`` ``[N, 4, 4]`` or ``[N, 3, 4]``;
  ``intrinsics`` ``[N, 4]``, ``[N, 3, 3]``, ``[4]`` or ``[3, 3]`` (the last two: every frame);
  ``size`` ``[2]`` = (w, h).
- ``.npy``: a structured array of N records with fields ``extrinsic`` (4, 4) or (3, 4), ``intrinsic``
  (4,) or (3, 3), ``width``, ``height`` (the same in every record).

Output of :func:`camera_for` (``camera.npy``): float32 ``[F, 20]``, one row per output frame: the
16 world-to-camera extrinsic values row-major, then ``fx, fy, cx, cy`` in the output frame's pixels
(see :data:`LAYOUT`).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardsmith.atomic import loads_json, read_json
from shardsmith.records import ItemError
from shardsmith.transform.geometry import Geometry, for_partner

__all__ = ["CameraTrack", "load_camera", "camera_for", "adjust_intrinsics", "LAYOUT", "ROW"]

#: the columns of a :func:`camera_for` row
LAYOUT = tuple(f"e{r}{c}" for r in range(4) for c in range(4)) + ("fx", "fy", "cx", "cy")
#: values per output frame
ROW = len(LAYOUT)  # 20


@dataclass(frozen=True, eq=False)
class CameraTrack:
    """One camera per source frame: ``extrinsics`` float64 ``[N, 4, 4]`` world-to-camera,
    ``intrinsics`` float64 ``[N, 4]`` (fx, fy, cx, cy) in pixels of an image of ``size`` (w, h)."""

    extrinsics: np.ndarray
    intrinsics: np.ndarray
    size: tuple[int, int]

    def __len__(self) -> int:
        return int(self.extrinsics.shape[0])


# ----------------------------------------------------------------------------- loading


def load_camera(path: str | os.PathLike, item_id: str, *, data: bytes | None = None) -> CameraTrack:
    """The camera track in ``path`` (``.json``, ``.npz``, ``.npy``: see the module docstring); ``data``: the
    file's bytes, already read (and checked against the plan's sha256 by the caller), read instead of ``path``.

    Raises :class:`ItemError` ``camera_unreadable`` (missing, not parseable, another suffix) or
    ``camera_bad_shape`` (a field missing, a matrix of another shape, a 4x4 whose last row is not
    0 0 0 1, non-finite values, fx or fy <= 0, skew, a size that is not two positive integers)."""
    path = os.fspath(path)
    name = f"{item_id}: its camera {os.path.basename(path)}"
    if data is None and not os.path.isfile(path):
        raise ItemError("camera_unreadable", f"{name}: {path!r} does not exist or is not a file; check the "
                        "camera column")
    suffix = Path(path).suffix.lower()
    src = io.BytesIO(data) if data is not None else path
    if suffix == ".json":
        return _from_json(src, name)
    if suffix == ".npz":
        return _from_npz(src, name)
    if suffix == ".npy":
        return _from_npy(src, name)
    raise ItemError("camera_unreadable", f"{name}: a camera track is a .json, .npz or .npy file, not "
                    f"{suffix or 'a file without suffix'}")


def _bad(name: str, what: str) -> ItemError:
    return ItemError("camera_bad_shape", f"{name}: {what}; see shardsmith.transform.camera for the accepted layout")


def _from_json(path: str | io.BytesIO, name: str) -> CameraTrack:
    try:
        doc = loads_json(path.getvalue().decode("utf-8")) if isinstance(path, io.BytesIO) else read_json(path)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ItemError("camera_unreadable", f"{name} is not readable JSON ({e}); fix or re-export it") from None
    if not isinstance(doc, dict):
        raise _bad(name, f"the JSON is a {type(doc).__name__}, not an object with width, height and frames")
    frames = doc.get("frames")
    if not isinstance(frames, list) or not frames:
        raise _bad(name, "'frames' is missing or not a non-empty list")
    if not all(isinstance(fr, dict) for fr in frames):
        raise _bad(name, "each entry of 'frames' is an object with 'extrinsic' (and 'intrinsic')")
    shared = doc.get("intrinsic")
    ext, intr = [], []
    for i, fr in enumerate(frames):
        if "extrinsic" not in fr:
            raise _bad(name, f"frame {i} has no 'extrinsic'")
        k = fr.get("intrinsic", shared)
        if k is None:
            raise _bad(name, f"frame {i} has no 'intrinsic' and there is no top-level one")
        ext.append(_array(fr["extrinsic"], name, f"frame {i}'s extrinsic"))
        intr.append(_array(k, name, f"frame {i}'s intrinsic"))
    shapes = {e.shape for e in ext} | {("k",) + k.shape for k in intr}
    if len({e.shape for e in ext}) > 1 or len({k.shape for k in intr}) > 1:
        raise _bad(name, f"the frames' matrices differ in shape ({sorted(map(str, shapes))})")
    return _track(np.stack(ext), np.stack(intr), (doc.get("width"), doc.get("height")), name)


def _array(v, name: str, what: str) -> np.ndarray:
    try:
        a = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        raise _bad(name, f"{what} is not a matrix of numbers") from None
    return a


def _from_npz(path: str | io.BytesIO, name: str) -> CameraTrack:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:  # noqa: BLE001
        raise ItemError("camera_unreadable", f"{name} is not a readable .npz ({e}); save it with numpy.savez") from None
    missing = [k for k in ("extrinsics", "intrinsics", "size") if k not in arrays]
    if missing:
        raise _bad(name, f"the .npz lacks {missing} (it has {sorted(arrays)})")
    size = arrays["size"].reshape(-1)
    if size.shape != (2,):
        raise _bad(name, f"'size' has shape {list(arrays['size'].shape)}, not [2] = (w, h)")
    ext, intr = arrays["extrinsics"], arrays["intrinsics"]
    if intr.shape in ((4,), (3, 3)) and ext.ndim == 3:
        intr = np.broadcast_to(intr, (ext.shape[0],) + intr.shape)
    return _track(ext, intr, (size[0].item(), size[1].item()), name)


def _from_npy(path: str | io.BytesIO, name: str) -> CameraTrack:
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001
        raise ItemError("camera_unreadable", f"{name} is not a readable .npy ({e}); save it with numpy.save") from None
    fields = arr.dtype.names or ()
    missing = [k for k in ("extrinsic", "intrinsic", "width", "height") if k not in fields]
    if missing or arr.ndim != 1:
        raise _bad(name, f"a .npy camera track is a 1-D structured array with fields extrinsic, intrinsic, width, "
                   f"height; this one has shape {list(arr.shape)} and fields {list(fields)}")
    if arr.shape[0] < 1:
        raise _bad(name, "the track has no frames")
    w, h = np.unique(arr["width"]), np.unique(arr["height"])
    if len(w) != 1 or len(h) != 1:
        raise _bad(name, "width and height differ between records; give the size the intrinsics refer to once")
    return _track(arr["extrinsic"], arr["intrinsic"], (w[0].item(), h[0].item()), name)


def _track(ext, intr, size, name: str) -> CameraTrack:
    """Checked, normalised :class:`CameraTrack` from ``[N, 3|4, 4]`` extrinsics and ``[N, 4]`` / ``[N, 3, 3]``
    intrinsics."""
    try:
        ext = np.asarray(ext, dtype=np.float64)
        intr = np.asarray(intr, dtype=np.float64)
    except (TypeError, ValueError):
        raise _bad(name, "the matrices are not numbers") from None
    if ext.ndim != 3 or ext.shape[0] < 1 or ext.shape[1:] not in ((4, 4), (3, 4)):
        raise _bad(name, f"extrinsics have shape {list(ext.shape)}; each is 4x4 or 3x4 [R | t]")
    n = ext.shape[0]
    if intr.shape not in ((n, 4), (n, 3, 3)):
        raise _bad(name, f"intrinsics have shape {list(intr.shape)} for {n} frames; each is [fx, fy, cx, cy] or a "
                   "3x3 K")
    if not (np.isfinite(ext).all() and np.isfinite(intr).all()):
        raise _bad(name, "the track holds NaN or infinite values")
    if ext.shape[1] == 3:
        bottom = np.broadcast_to(np.array([0.0, 0.0, 0.0, 1.0]), (n, 1, 4))
        ext = np.concatenate([ext, bottom], axis=1)
    elif not np.allclose(ext[:, 3], [0.0, 0.0, 0.0, 1.0], atol=1e-6):
        bad = int(np.flatnonzero(~np.isclose(ext[:, 3], [0, 0, 0, 1], atol=1e-6).all(axis=1))[0])
        raise _bad(name, f"frame {bad}'s 4x4 extrinsic has last row {ext[bad, 3].tolist()}, not [0, 0, 0, 1]")
    if intr.ndim == 3:
        k = intr
        scale = np.maximum(np.abs(k[:, 0, 0]), 1.0)
        if (np.abs(k[:, 0, 1]) > 1e-9 * scale).any():
            raise _bad(name, "a 3x3 K has skew (K[0][1] != 0), which the output layout cannot carry")
        if (np.abs(k[:, 1, 0]) > 1e-9 * scale).any() or not np.allclose(k[:, 2], [0.0, 0.0, 1.0]):
            raise _bad(name, "a 3x3 K is not [[fx, 0, cx], [0, fy, cy], [0, 0, 1]]")
        intr = np.stack([k[:, 0, 0], k[:, 1, 1], k[:, 0, 2], k[:, 1, 2]], axis=1)
    if (intr[:, :2] <= 0).any():
        raise _bad(name, "fx and fy must be > 0")
    w, h = size
    if not all(isinstance(v, (int, np.integer)) or (isinstance(v, float) and v.is_integer()) for v in (w, h)) \
            or isinstance(w, bool) or isinstance(h, bool) or int(w) < 1 or int(h) < 1:
        raise _bad(name, f"the size the intrinsics refer to is width={w!r}, height={h!r}; give two positive integers")
    return CameraTrack(np.ascontiguousarray(ext), np.ascontiguousarray(intr), (int(w), int(h)))


# ----------------------------------------------------------------------------- onto the target


def adjust_intrinsics(intrinsics: np.ndarray, size: tuple[int, int], geom: Geometry) -> np.ndarray:
    """``[N, 4]`` (fx, fy, cx, cy) in pixels of ``size`` -> the same in the output pixels of ``geom``:
    first rescaled to ``geom.source_size`` (sx = sw / w, sy = sh / h) if ``size`` differs, then
    ``fx' = fx * rw / sw``, ``cx' = cx * rw / sw - crop_x0`` (likewise y with rh, sh, crop_y0), where
    (rw, rh) = ``geom.resize``. Pure; float64."""
    k = np.asarray(intrinsics, dtype=np.float64).reshape(-1, 4)
    (w, h), (sw, sh), (rw, rh) = size, geom.source_size, geom.resize
    kx, ky = (sw / w) * (rw / sw), (sh / h) * (rh / sh)
    x0, y0 = geom.crop[0], geom.crop[1]
    return np.stack([k[:, 0] * kx, k[:, 1] * ky, k[:, 2] * kx - x0, k[:, 3] * ky - y0], axis=1)


def camera_for(track: CameraTrack, geom: Geometry, source_frames: int, item_id: str) -> np.ndarray:
    """The track on the target's output: float32 ``[F, 20]`` (:data:`LAYOUT`), F = ``len(frame_indices)``
    (a still target, ``frame_indices`` None: frame 0, F = 1).

    The track must have one camera per source frame, ``len(track) == source_frames`` (the target
    clip's frame count), else ``ItemError camera_length_mismatch`` naming both. The intrinsics' size
    must have the target's aspect ratio (``camera_geometry_mismatch`` otherwise: never stretched); they
    are moved onto the output pixels by :func:`adjust_intrinsics`; extrinsics are unchanged (a resize and
    crop do not move the camera). The rows are checked after the float32 cast: a value finite in float64
    but not in float32 (a translation of 1e300, an fx of 1e40 or one the resize takes past float32's
    range) or an fx / fy that is no longer > 0 there (1e-300) is ``camera_bad_shape``, never written as
    inf or 0."""
    if len(track) != source_frames:
        raise ItemError("camera_length_mismatch",
                        f"{item_id}: its camera track has {len(track)} frames but its clip has {source_frames}; "
                        "give one camera per frame of the clip")
    for_partner(geom, "camera", track.size[0], track.size[1], name=item_id)  # refuses another aspect ratio
    idx = list(geom.frame_indices) if geom.frame_indices is not None else [0]
    if max(idx) >= len(track) or min(idx) < 0:
        raise ItemError("camera_length_mismatch",
                        f"{item_id}: the target takes frame {max(idx)} but its camera track has {len(track)} frames; "
                        "give one camera per frame of the clip")
    ext = track.extrinsics[idx].reshape(len(idx), 16)
    intr = adjust_intrinsics(track.intrinsics[idx], track.size, geom)
    wide = np.concatenate([ext, intr], axis=1)  # float64
    with np.errstate(over="ignore", under="ignore"):  # checked just below
        rows = wide.astype(np.float32)
    name = f"{item_id}: its camera track"
    bad = ~np.isfinite(rows)
    if bad.any():
        r, c = (int(v) for v in np.argwhere(bad)[0])
        raise _bad(name, f"frame {idx[r]}'s {LAYOUT[c]} is {wide[r, c]:g} on the output pixels, beyond float32's range "
                   "(about 3.4e38), in which camera rows are stored; give values float32 can hold")
    bad = rows[:, 16:18] <= 0
    if bad.any():
        r, c = (int(v) for v in np.argwhere(bad)[0])
        raise _bad(name, f"frame {idx[r]}'s {LAYOUT[16 + c]} is {wide[r, 16 + c]:g} on the output pixels, which "
                   "float32 (in which camera rows are stored) rounds to 0; fx and fy must stay > 0")
    return rows
