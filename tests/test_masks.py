"""Masks tied to their target's geometry (issue 18): a mask drawn on the target's source lands on the
target's output pixels after the target's own resize and crop (never LTX's stretch), at any bucket and
at any resolution of the same aspect ratio; the latent grid groups frames as the VAE does (frame 0
alone, then groups of 8); audio masks are nearest-resampled and binarised as LTX does."""

from __future__ import annotations

import av
import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter

from media_factory import source_photo
from shardsmith.records import ItemError
from shardsmith.transform.audio import wav_bytes
from shardsmith.transform.buckets import Bucket
from shardsmith.transform.geometry import decide, for_partner
from shardsmith.transform.masks import (audio_envelope, audio_mask, latent_mask, load_audio_mask, load_mask,
                                        mask_to_target, target_mask)
from shardsmith.transform.video import resize_crop_image


def _luma(rgb: np.ndarray) -> np.ndarray:
    r, g, b = (rgb[..., i].astype(np.float32) for i in range(3))
    return (0.299 * r + 0.587 * g + 0.114 * b) / 255.0


def _near_edge(ref: np.ndarray, d: int) -> np.ndarray:
    """Pixels within ``d`` px (chessboard distance) of a pixel of ``ref``'s other value."""
    def dilate(m):
        p = np.pad(m, d, mode="edge")
        out = np.zeros_like(m)
        for dy in range(2 * d + 1):
            for dx in range(2 * d + 1):
                out |= p[dy:dy + m.shape[0], dx:dx + m.shape[1]]
        return out
    return dilate(ref) & dilate(~ref)


def _check_lines_up(got: np.ndarray, ref: np.ndarray, band: int, min_agree: float = 0.99) -> None:
    """How "lines up" is measured: >= ``min_agree`` of the pixels agree, and every pixel that disagrees
    lies within ``band`` px of an edge of the reference mask (a thin boundary band, nowhere else)."""
    assert got.shape == ref.shape
    dis = got != ref
    agree = 1 - dis.mean()
    far = int((dis & ~_near_edge(ref, band)).sum())
    assert agree >= min_agree and far == 0, (agree, far)


# (photo, bucket W x H): portrait, landscape and square sources, into portrait, landscape and square
# buckets, down-scaled and (chelsea 768x512) up-scaled; each crops on another axis
CASES = [
    ("grace_hopper", 160, 256),  # portrait 512x600 -> portrait bucket, crop x
    ("grace_hopper", 256, 160),  # portrait -> landscape bucket, crop y
    ("chelsea", 256, 160),  # landscape 451x300 -> landscape bucket, crop y
    ("chelsea", 192, 192),  # landscape -> square, crop x
    ("chelsea", 768, 512),  # up-scaled 1.7x
    ("coffee", 128, 128),  # landscape 600x400 -> square
    ("astronaut", 192, 192),  # square -> square: no crop
    ("astronaut", 96, 160),  # square -> portrait, crop x
]


def _scene(photo: str) -> tuple[Image.Image, float]:
    """A real photo, softened (Gaussian radius 3) so that "brightness > t" has edges rather than texture
    noise at the threshold, and t = its median brightness (half the picture masked)."""
    im = source_photo(photo).filter(ImageFilter.GaussianBlur(3))
    return im, float(np.median(_luma(np.asarray(im))))


@pytest.mark.parametrize("photo,bw,bh", CASES)
def test_a_mask_drawn_on_the_source_lands_on_the_targets_pixels(photo, bw, bh):
    im, t = _scene(photo)
    w, h = im.size
    geom = decide(w, h, Bucket(bw, bh, 1))
    mask = (_luma(np.asarray(im)) > t).astype(np.float32)
    got = mask_to_target(mask, for_partner(geom, "mask", w, h))
    assert got.shape == (1, bh, bw) and got.dtype == np.uint8 and set(np.unique(got)) <= {0, 1}
    ref = _luma(resize_crop_image(im, geom)) > t  # the target's own pixels, thresholded
    _check_lines_up(got[0].astype(bool), ref, band=1)
    # the measure has teeth: the same mask 2 px to the side fails it, and so does LTX's stretch to the
    # bucket whenever the target is cropped
    with pytest.raises(AssertionError):
        _check_lines_up(np.roll(got[0].astype(bool), 2, axis=1), ref, band=1)
    if geom.resize != (bw, bh):
        stretched = np.asarray(Image.fromarray(mask, "F").resize((bw, bh), Image.BILINEAR)) > 0.5
        with pytest.raises(AssertionError):
            _check_lines_up(stretched, ref, band=1)


@pytest.mark.parametrize("photo,bw,bh", CASES)
@pytest.mark.parametrize("scale", [0.5, 1.5])
def test_a_mask_at_another_resolution_of_the_same_shape_lands_on_the_same_pixels(photo, bw, bh, scale):
    im, t = _scene(photo)
    w, h = im.size
    geom = decide(w, h, Bucket(bw, bh, 1))
    pw, ph = round(w * scale), round(h * scale)
    small = im.resize((pw, ph), Image.BICUBIC)  # the same scene, the mask drawn at another resolution
    mask = (_luma(np.asarray(small)) > t).astype(np.float32)
    pg = for_partner(geom, "mask", pw, ph)
    got = mask_to_target(mask, pg)[0].astype(bool)
    ref = _luma(resize_crop_image(im, geom)) > t
    # the band: the target's own 1 px, plus half a mask pixel in output pixels (a mask pixel covers
    # resize / mask size of them: its staircase edge can sit half of that from the true edge)
    band = 1 + int(np.ceil(0.5 * geom.resize[0] / pw))
    _check_lines_up(got, ref, band=band, min_agree=0.98)


def test_a_moving_mask_takes_the_targets_frames_and_a_still_one_repeats(tmp_path):
    # a 20-frame 120x80 mask whose square moves 3 px right per frame; the target takes frames 3, 5, ... 19
    frames = np.zeros((20, 80, 120), np.uint8)
    for i in range(20):
        frames[i, 20:60, 25 + 3 * i:55 + 3 * i] = 255
    np.save(tmp_path / "m.npy", frames)
    geom = decide(240, 160, Bucket(96, 96, 9), frame_indices=list(range(3, 20, 2)), fps=12.0)
    got = target_mask(tmp_path / "m.npy", geom, "s/x")
    assert got.shape == (9, 96, 96) and got.dtype == np.uint8
    pg = for_partner(geom, "mask", 120, 80)
    for k, i in enumerate(geom.frame_indices):
        assert np.array_equal(got[k], mask_to_target(frames[i:i + 1] / 255.0, geom=_still(pg))[0])
    # the square's left edge in output pixels: source x = 25 + 3i (the mask is half the target's size),
    # scaled by the resize, less the crop; the first masked pixel is the first whose centre is past it
    sx = geom.resize[0] / 120
    for k, i in enumerate(geom.frame_indices):
        edge = (25 + 3 * i) * sx - geom.crop[0]
        left = np.flatnonzero(got[k].any(axis=0))[0]
        assert edge < left + 0.5 <= edge + 1 + 1e-9, (i, edge, left)
    # a still mask (an image) is repeated over the target's frames
    Image.fromarray(frames[4]).save(tmp_path / "still.png")
    still = target_mask(tmp_path / "still.png", geom, "s/x")
    assert still.shape == (9, 96, 96) and all(np.array_equal(still[0], f) for f in still)
    assert np.array_equal(still[0], mask_to_target(frames[4] / 255.0, for_partner(geom, "mask", 120, 80))[0])


def _still(g):
    from dataclasses import replace

    return replace(g, frame_indices=(0,))


def _write_mask_video(path, frames: np.ndarray, fps: int = 12) -> None:
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        s.options = {"crf": "0", "threads": "1"}
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(np.repeat(f[..., None], 3, axis=2), format="rgb24")
            vf.pts = i
            for p in s.encode(vf):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def test_a_mask_video_lands_like_the_same_mask_as_an_array(tmp_path):
    frames = np.zeros((16, 80, 120), np.uint8)
    for i in range(16):
        frames[i, 16:56, 8 + 4 * i:48 + 4 * i] = 255
    _write_mask_video(tmp_path / "m.mp4", frames)
    np.save(tmp_path / "m.npy", frames)
    geom = decide(120, 80, Bucket(64, 64, 9), frame_indices=[1, 2, 3, 5, 7, 8, 9, 11, 15], fps=12.0)
    from_video = target_mask(tmp_path / "m.mp4", geom, "s/v")
    from_array = target_mask(tmp_path / "m.npy", geom, "s/v")
    assert from_video.shape == from_array.shape == (9, 64, 64)
    for a, b in zip(from_video.astype(bool), from_array.astype(bool)):  # the codec's loss only, at edges
        _check_lines_up(a, b, band=1)
    # a mask clip shorter than the frames the target takes, or of another shape, is refused
    long_geom = decide(120, 80, Bucket(64, 64, 9), frame_indices=list(range(10, 19)), fps=12.0)
    for f in ("m.mp4", "m.npy"):
        with pytest.raises(ItemError) as e:
            target_mask(tmp_path / f, long_geom, "s/v")
        assert e.value.reason == "mask_too_short", e.value.detail
    wide = decide(240, 80, Bucket(64, 64, 9), frame_indices=list(range(9)), fps=12.0)
    with pytest.raises(ItemError) as e:
        target_mask(tmp_path / "m.mp4", wide, "s/v")
    assert e.value.reason == "mask_geometry_mismatch" and "s/v" in e.value.detail


def test_mask_to_target_refuses_a_geometry_made_for_another_size():
    geom = decide(120, 80, Bucket(64, 64, 1))
    with pytest.raises(ValueError, match="for_partner"):
        mask_to_target(np.zeros((1, 40, 60), np.float32), geom)  # the target's geometry, a half-size mask


# ----------------------------------------------------------------------------- load_mask


def test_load_mask_reads_images_arrays_and_tensors(tmp_path):
    rng = np.random.default_rng(0)
    gray = rng.integers(0, 256, (30, 40), dtype=np.uint8)
    want = gray.astype(np.float32) / 255
    Image.fromarray(gray).save(tmp_path / "g.png")
    assert np.allclose(load_mask(tmp_path / "g.png", "i"), want[None], atol=1e-6)
    rgb = np.stack([gray, gray, gray], axis=2)
    Image.fromarray(rgb).save(tmp_path / "c.png")
    assert np.allclose(load_mask(tmp_path / "c.png", "i"), want[None], atol=1e-3)  # luma of grey is grey
    rgba = np.concatenate([rgb, np.zeros((30, 40, 1), np.uint8)], axis=2)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    assert np.allclose(load_mask(tmp_path / "a.png", "i"), want[None], atol=1e-3)  # alpha ignored
    Image.fromarray(gray.astype(np.uint16) * 257).save(tmp_path / "g16.png")
    assert np.allclose(load_mask(tmp_path / "g16.png", "i"), want[None], atol=1e-4)
    Image.fromarray(gray > 127).save(tmp_path / "b.png")
    assert np.array_equal(load_mask(tmp_path / "b.png", "i"), (gray > 127)[None].astype(np.float32))
    # EXIF orientation applied, as the target's decode does (6: rotate 90 clockwise to display)
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(gray).save(tmp_path / "r.png", exif=exif)
    assert np.allclose(load_mask(tmp_path / "r.png", "i")[0], np.rot90(want, -1), atol=1e-6)

    stack = rng.random((5, 30, 40)).astype(np.float32)
    for arr, expect in [(stack[0], stack[:1]), (stack, stack), (stack[:, None], stack), (stack[..., None], stack),
                        (stack > 0.5, (stack > 0.5).astype(np.float32)),
                        ((stack > 0.5).astype(np.uint8) * 255, (stack > 0.5).astype(np.float32)),
                        ((stack > 0.5).astype(np.int64), (stack > 0.5).astype(np.float32))]:
        np.save(tmp_path / "m.npy", arr)
        got = load_mask(tmp_path / "m.npy", "i")
        assert got.dtype == np.float32 and np.array_equal(got, expect)
    torch.save(torch.from_numpy(stack), tmp_path / "t.pt")
    assert np.array_equal(load_mask(tmp_path / "t.pt", "i"), stack)
    torch.save({"mask": torch.from_numpy(stack).bfloat16()}, tmp_path / "d.pt")
    assert np.allclose(load_mask(tmp_path / "d.pt", "i"), stack, atol=4e-3)
    assert np.array_equal(load_mask(tmp_path / "t.pt", "i", frames=[4, 1, 1]), stack[[4, 1, 1]])


@pytest.mark.parametrize("name,content,reason", [
    ("missing.png", None, "mask_unreadable"),
    ("text.png", b"not a picture", "mask_unreadable"),
    ("empty.png", b"", "mask_unreadable"),
    ("text.mp4", b"not a video at all", "mask_unreadable"),
    ("bad.npy", b"\x93NUMPY garbage", "mask_unreadable"),
    ("bad.pt", b"garbage", "mask_unreadable"),
    ("obj.npy", "object", "mask_unreadable"),
    ("colour.npy", np.zeros((30, 40, 3), np.uint8), "mask_bad_shape"),
    ("five.npy", np.zeros((1, 2, 3, 4, 5)), "mask_bad_shape"),
    ("zero.npy", np.zeros((0, 4, 4)), "mask_bad_shape"),
    ("str.npy", np.array([["a", "b"]]), "mask_bad_shape"),
    ("nokey.pt", {"latents": torch.zeros(2, 2)}, "mask_bad_shape"),
    ("list.pt", [1, 2], "mask_bad_shape"),
    ("big.npy", np.full((4, 4), 2.0, np.float32), "mask_bad_values"),
    ("nan.npy", np.full((4, 4), np.nan, np.float32), "mask_bad_values"),
    ("neg.npy", np.full((4, 4), -1, np.int32), "mask_bad_values"),
    ("u16.npy", np.full((4, 4), 1000, np.uint16), "mask_bad_values"),
])
def test_load_mask_refuses_bad_files_naming_the_item_and_file(tmp_path, name, content, reason):
    p = tmp_path / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    elif isinstance(content, np.ndarray):
        np.save(p, content)
    elif content == "object":
        np.save(p, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif content is not None:
        torch.save(content, p)
    with pytest.raises(ItemError) as e:
        load_mask(p, "src/item7")
    assert e.value.reason == reason, e.value.detail
    assert "src/item7" in e.value.detail and name in e.value.detail


# ----------------------------------------------------------------------------- latent_mask


def test_latent_mask_groups_frame_0_alone_then_temporal_groups():
    # 5 frames, 4x4 pixels, spatial 2, temporal 2: latent frames {0}, {1, 2}, {3, 4}; cells of 2x2 pixels
    m = np.zeros((5, 4, 4), np.uint8)
    m[0, 0, 0] = 1  # frame 0, top-left cell
    m[2, 3, 3] = 1  # frame 2 (latent 1), bottom-right cell
    m[3, 1, 2] = 1  # frame 3 (latent 2), top-right cell
    got = latent_mask(m, spatial=2, temporal=2)
    want = np.array([[[1, 0], [0, 0]],
                     [[0, 0], [0, 1]],
                     [[0, 1], [0, 0]]], np.float32)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    # LTX's grouping from frame 0 ({0, 1}, {2, 3}, {4}) would put frame 2's pixel in latent 1 and frame 3's
    # in latent 1 too; frame 1 alone shows the difference: it belongs to latent 1, not latent 0
    only1 = np.zeros((5, 4, 4), np.uint8)
    only1[1] = 1
    assert latent_mask(only1, 2, 2)[:, 0, 0].tolist() == [0, 1, 0]
    # the real VAE: 17 frames -> 3 latent frames; frame 8 is latent 1, frame 9 latent 2
    big = np.zeros((17, 64, 96), np.uint8)
    big[8, 40, 70] = 1
    big[9, 0, 0] = 1
    lat = latent_mask(big, 32, 8)
    assert lat.shape == (3, 2, 3) and lat.sum() == 2 and lat[1, 1, 2] == 1 and lat[2, 0, 0] == 1


def test_latent_mask_rule_mean():
    # 3 frames, spatial 2, temporal 2: latent 0 = frame 0's 2x2 cells, latent 1 = frames 1-2 (8 pixels a cell)
    m = np.zeros((3, 2, 4), np.float32)
    m[0, :, 0:2] = [[1, 1], [1, 0]]  # 3/4 > 0.5 -> 1
    m[0, :, 2:4] = [[1, 1], [0, 0]]  # 2/4 = 0.5, not > 0.5 -> 0
    m[1, :, 0:2] = 1  # 4/8 over the group -> 0
    m[1, :, 2:4] = 1
    m[2, 0, 2] = 1  # 5/8 -> 1
    got = latent_mask(m, spatial=2, temporal=2, rule="mean")
    assert np.array_equal(got, np.array([[[1, 0]], [[0, 1]]], np.float32))
    assert np.array_equal(latent_mask(m, 2, 2, rule="any"), np.array([[[1, 1]], [[1, 1]]], np.float32))
    # soft values: "mean" averages them, "any" binarises each pixel at > 0.5 first
    soft = np.full((1, 2, 2), 0.6, np.float32)
    assert latent_mask(soft, 2, 8, rule="mean").item() == 1 and latent_mask(soft * 0.8, 2, 8).item() == 0


@pytest.mark.parametrize("shape,spatial,temporal,rule,match", [
    ((4, 4, 4), 2, 2, "any", "1 \\+ 2k"),
    ((16, 64, 64), 32, 8, "any", "1 \\+ 8k"),
    ((5, 6, 4), 4, 2, "any", "multiple of 4"),
    ((5, 4, 6), 4, 2, "any", "multiple of 4"),
    ((5, 4, 4), 2, 2, "max", "rule"),
    ((4, 4), 2, 2, "any", "\\[F, H, W\\]"),
    ((5, 4, 4), 0, 2, "any", ">= 1"),
])
def test_latent_mask_refuses_what_the_vae_could_not_encode(shape, spatial, temporal, rule, match):
    with pytest.raises(ValueError, match=match):
        latent_mask(np.zeros(shape, np.uint8), spatial, temporal, rule=rule)


def test_mask_to_target_then_latent_mask_has_the_latent_grid_of_the_bucket(tmp_path):
    frames = np.zeros((40, 90, 160), np.uint8)
    frames[:, 30:60, 40:120] = 255
    np.save(tmp_path / "m.npy", frames)
    geom = decide(320, 180, Bucket(128, 64, 17), frame_indices=list(range(2, 36, 2)), fps=12.0)
    px = target_mask(tmp_path / "m.npy", geom, "s/x")
    lat = latent_mask(px, 32, 8)
    assert px.shape == (17, 64, 128) and lat.shape == (3, 2, 4)


def _latent_mask_by_hand(px: np.ndarray, spatial: int, temporal: int) -> np.ndarray:
    """The LTX VAE's grouping written out cell by cell: latent frame 0 is pixel frame 0 alone, latent
    frame t > 0 is pixel frames 1 + temporal (t - 1) .. temporal t; a cell is masked when any of its pixels is."""
    f, h, w = px.shape
    out = np.zeros((1 + (f - 1) // temporal, h // spatial, w // spatial), np.float32)
    for t in range(out.shape[0]):
        group = [0] if t == 0 else list(range(1 + temporal * (t - 1), 1 + temporal * t))
        for y in range(out.shape[1]):
            for x in range(out.shape[2]):
                out[t, y, x] = float(px[group, spatial * y:spatial * (y + 1), spatial * x:spatial * (x + 1)].any())
    return out


# (source W x H, bucket): a portrait, a landscape and a square target, each cropped on another axis
GRID_CASES = [((360, 640), Bucket(96, 160, 17)), ((640, 360), Bucket(160, 96, 25)), ((400, 300), Bucket(128, 128, 17))]


@pytest.mark.parametrize("size,bucket", GRID_CASES, ids=["portrait", "landscape", "square"])
def test_a_moving_source_mask_on_the_latent_grid_equals_the_hand_pooling(tmp_path, size, bucket):
    """A mask drawn on the target's source (a square that moves and grows), cut with the target's geometry
    and pooled with the real VAE's factors (32 px, 8 frames): the latent mask of each bucket equals the
    cell-by-cell computation, and its grid is the latent's [1 + (F - 1) / 8, H / 32, W / 32]."""
    w, h = size
    n = bucket.frames + 6
    frames = np.zeros((n, h, w), np.uint8)
    for i in range(n):
        y, x = (h * i) // (2 * n), (w * (n - i)) // (2 * n)
        frames[i, y:y + h // 6 + 2 * i, x:x + w // 8 + 3 * i] = 255
    np.save(tmp_path / "m.npy", frames)
    geom = decide(w, h, bucket, frame_indices=list(range(3, 3 + bucket.frames)), fps=24.0)
    px = target_mask(tmp_path / "m.npy", geom, "s/x")
    assert px.shape == (bucket.frames, bucket.height, bucket.width)
    got = latent_mask(px, 32, 8)
    want = _latent_mask_by_hand(px, 32, 8)
    assert got.shape == (1 + (bucket.frames - 1) // 8, bucket.height // 32, bucket.width // 32)
    assert np.array_equal(got, want)
    assert 0 < want.sum() < want.size and len({want[t].tobytes() for t in range(len(want))}) == len(want)
    # the hand pooling has teeth: grouping from frame 0 (LTX's {0..7}, {8..15}, ...) gives another mask here
    ltx = np.stack([px[8 * t:8 * (t + 1)].reshape(-1, bucket.height // 32, 32, bucket.width // 32, 32)
                    .any(axis=(0, 2, 4)) for t in range(len(want))]).astype(np.float32)
    assert not np.array_equal(ltx, want)


# ----------------------------------------------------------------------------- audio


def test_audio_mask_is_nearest_then_above_half():
    assert audio_mask(np.array([0, 1, 1, 0.0]), 8).tolist() == [0, 0, 1, 1, 1, 1, 0, 0]
    assert audio_mask(np.array([0, 0, 0, 1, 1, 1.0]), 3).tolist() == [0, 0, 1]  # steps take values 0, 2, 4
    assert audio_mask(np.array([0.5, 0.51]), 2).tolist() == [0, 1]  # strictly above 0.5
    rng = np.random.default_rng(1)
    for n, steps in [(100, 37), (37, 100), (1, 5), (121, 121), (1000, 3)]:
        m = rng.random(n).astype(np.float32)
        ref = torch.nn.functional.interpolate(torch.from_numpy(m)[None, None], size=steps, mode="nearest")[0, 0]
        assert np.array_equal(audio_mask(m, steps), (ref > 0.5).float().numpy()), (n, steps)
    with pytest.raises(ValueError):
        audio_mask(np.zeros((2, 3)), 4)
    with pytest.raises(ValueError):
        audio_mask(np.zeros(3), 0)


def test_audio_envelope_and_audio_mask_files(tmp_path):
    x = np.array([[0.0, 0, 1, -1, 0.5, 0.5], [0, 0, 1, 1, -0.5, 0.5]])
    assert np.allclose(audio_envelope(x, 3), [0, 1, 0.5])
    assert np.allclose(audio_envelope(x[0], 2), [1 / 3, 2 / 3])
    assert np.allclose(audio_envelope(np.array([0.0, 1.0]), 4), [0, 0, 1, 1])  # windows without a sample
    # a recording: 1 s of silence then 1 s of a loud square wave (|x| = 0.8), at 16 kHz; 25 steps a second
    rate = 16000
    wave = np.concatenate([np.zeros(rate), 0.8 * np.sign(np.sin(2 * np.pi * 220 * np.arange(rate) / rate) + 1e-9)])
    (tmp_path / "m.wav").write_bytes(wav_bytes(wave.astype(np.float32), rate))
    got = load_audio_mask(tmp_path / "m.wav", "a/1", 50, rate=rate)
    assert got.tolist() == [0.0] * 25 + [1.0] * 25
    np.save(tmp_path / "m.npy", np.array([0, 0, 1, 1], np.uint8))
    assert load_audio_mask(tmp_path / "m.npy", "a/1", 8).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    torch.save({"mask": torch.tensor([[1.0, 0.0]])}, tmp_path / "m.pt")
    assert load_audio_mask(tmp_path / "m.pt", "a/1", 4).tolist() == [1, 1, 0, 0]
    np.save(tmp_path / "bad.npy", np.zeros((2, 3)))
    with pytest.raises(ItemError) as e:
        load_audio_mask(tmp_path / "bad.npy", "a/1", 4)
    assert e.value.reason == "mask_bad_shape" and "bad.npy" in e.value.detail
    (tmp_path / "bad.wav").write_bytes(b"RIFF....not audio")
    with pytest.raises(ItemError) as e:
        load_audio_mask(tmp_path / "bad.wav", "a/1", 4)
    assert e.value.reason == "mask_unreadable" and "a/1" in e.value.detail
