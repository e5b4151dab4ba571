"""Pure bucket / geometry / frame arithmetic (shardsmith.transform.buckets). Fast, no I/O."""

from __future__ import annotations

import math

import pytest

from shardsmith.transform.buckets import (
    Bucket,
    BucketError,
    ResizeCrop,
    available_frames,
    choose_bucket,
    effective_fps,
    frame_indices,
    latent_frames,
    latent_size,
    parse_buckets,
    resize_crop,
    validate_buckets,
)

# ----------------------------------------------------------------------------- parsing


def test_bucket_str_and_parse_roundtrip():
    b = Bucket(960, 544, 49)
    assert str(b) == "960x544x49"
    assert Bucket.parse("960x544x49") == b
    assert Bucket.parse(" 960 X 544 x 49 ") == b
    assert Bucket.parse(str(b)) == b


def test_parse_buckets_string_and_list():
    want = [Bucket(960, 544, 49), Bucket(512, 512, 1)]
    assert parse_buckets("960x544x49;512x512x1") == want
    assert parse_buckets("960x544x49; 512x512x1;") == want  # spaces, trailing ';'
    assert parse_buckets(["960x544x49", "512x512x1"]) == want


@pytest.mark.parametrize(
    "spec, token",
    [
        ("960x544x49;960x544", "960x544"),
        ("960x544x49;abc", "abc"),
        ("960x-544x49", "960x-544x49"),
        (["960x544x49", "0x512x1"], "0x512x1"),
        ("512x512x0", "512x512x0"),
    ],
)
def test_parse_buckets_names_bad_token(spec, token):
    with pytest.raises(BucketError) as ei:
        parse_buckets(spec)
    assert token in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_parse_buckets_empty_and_duplicate():
    with pytest.raises(BucketError, match="no buckets"):
        parse_buckets("")
    with pytest.raises(BucketError, match="no buckets"):
        parse_buckets(" ; ")
    with pytest.raises(BucketError, match="512x512x1 is listed twice"):
        parse_buckets("512x512x1;960x544x49;512x512x1")
    with pytest.raises(BucketError, match="one 'WxHxF' per list entry"):
        parse_buckets(["512x512x1;960x544x49"])


# ----------------------------------------------------------------------------- validation


def test_validate_ok_including_images():
    validate_buckets(parse_buckets("960x544x49;512x512x1;768x448x89;1024x576x121"), 32, 8)


def test_validate_message_gives_nearest_values():
    with pytest.raises(BucketError) as ei:
        validate_buckets([Bucket(500, 512, 48)], 32, 8)
    msg = str(ei.value)
    assert msg == (
        "bucket 500x512x48: width 500 is not a multiple of 32 (nearest 512 or 480); "
        "frames 48 is not 1 + 8k (nearest 49 or 41)"
    )


def test_validate_lists_every_bad_bucket_and_small_values():
    with pytest.raises(BucketError) as ei:
        validate_buckets(parse_buckets("960x544x49;960x540x50;16x512x1"), 32, 8)
    lines = str(ei.value).splitlines()
    assert len(lines) == 2
    assert lines[0] == (
        "bucket 960x540x50: height 540 is not a multiple of 32 (nearest 544 or 512); "
        "frames 50 is not 1 + 8k (nearest 49 or 57)"
    )
    # below one block: the only valid neighbour is the block itself
    assert lines[1] == "bucket 16x512x1: width 16 is not a multiple of 32 (nearest 32)"


# ----------------------------------------------------------------------------- choice


BUCKETS = parse_buckets("960x544x49;960x544x25;544x960x49;512x512x49;768x768x49;512x512x1;960x544x1")


def test_choose_aspect_first():
    # landscape 16:9 source -> the landscape bucket, even though square ones exist
    assert choose_bucket(1920, 1080, 100, BUCKETS) == Bucket(960, 544, 49)
    # portrait source -> the portrait bucket
    assert choose_bucket(1080, 1920, 100, BUCKETS) == Bucket(544, 960, 49)


def test_choose_more_frames_then_area():
    # square: 512x512x49 and 768x768x49 tie on aspect and frames -> larger area
    assert choose_bucket(300, 300, 49, BUCKETS) == Bucket(768, 768, 49)
    # only 30 frames: 960x544x25 beats 960x544x1 (more frames)
    assert choose_bucket(1920, 1080, 30, BUCKETS) == Bucket(960, 544, 25)
    # a single image picks the F=1 bucket of its aspect
    assert choose_bucket(1920, 1080, 1, BUCKETS) == Bucket(960, 544, 1)
    assert choose_bucket(1000, 1000, 1, BUCKETS) == Bucket(512, 512, 1)


def test_choose_aspect_beats_frames():
    # square clip with 49 frames, but only landscape video buckets and a square image bucket:
    # the closest aspect (square, F=1) wins over more frames (LTX's key order)
    bs = parse_buckets("960x544x49;512x512x1")
    assert choose_bucket(512, 512, 49, bs) == Bucket(512, 512, 1)


def test_choose_none_when_nothing_eligible():
    assert choose_bucket(1920, 1080, 24, parse_buckets("960x544x49;960x544x25")) is None
    assert choose_bucket(1920, 1080, 0, BUCKETS) is None


def test_choose_key_matches_ltx_formula():
    w, h, n = 1280, 720, 60
    elig = [b for b in BUCKETS if b.frames <= n]
    ref = min(elig, key=lambda b: (abs(math.log(w / h) - math.log(b.width / b.height)), -b.frames, -b.area))
    assert choose_bucket(w, h, n, BUCKETS) == ref


# ----------------------------------------------------------------------------- resize + crop


def test_resize_crop_landscape():
    rc = resize_crop(1920, 1080, 512, 512)
    assert rc == ResizeCrop(910, 512, 199, 0, 512, 512)  # 1920*512/1080 = 910.2
    assert rc.box == (199, 0, 711, 512)
    assert rc.as_dict() == {
        "resize_w": 910, "resize_h": 512, "crop_x0": 199, "crop_y0": 0, "crop_w": 512, "crop_h": 512,
    }


def test_resize_crop_portrait():
    rc = resize_crop(720, 1280, 544, 960)
    # width limits: 720 -> 544 (x0.7556), height 1280 -> 967.1 -> 967
    assert (rc.resize_w, rc.resize_h) == (544, 967)
    assert (rc.crop_x0, rc.crop_y0, rc.crop_w, rc.crop_h) == (0, 3, 544, 960)


def test_resize_crop_exact_and_upscale():
    assert resize_crop(960, 544, 960, 544) == ResizeCrop(960, 544, 0, 0, 960, 544)
    assert resize_crop(480, 272, 960, 544) == ResizeCrop(960, 544, 0, 0, 960, 544)
    rc = resize_crop(100, 50, 200, 200)  # upscale, crop the sides
    assert rc == ResizeCrop(400, 200, 100, 0, 200, 200)


@pytest.mark.parametrize("src", [(1919, 1081), (333, 777), (1000, 999), (7, 3), (257, 256)])
@pytest.mark.parametrize("out", [(512, 512), (960, 544), (544, 960), (32, 32)])
def test_resize_crop_covers_and_keeps_one_side(src, out):
    rc = resize_crop(*src, *out)
    assert rc.resize_w >= out[0] and rc.resize_h >= out[1]
    assert rc.resize_w == out[0] or rc.resize_h == out[1]
    assert 0 <= rc.crop_x0 and rc.crop_x0 + rc.crop_w <= rc.resize_w
    assert 0 <= rc.crop_y0 and rc.crop_y0 + rc.crop_h <= rc.resize_h
    # aspect kept to within one pixel of rounding
    assert abs(rc.resize_w / rc.resize_h - src[0] / src[1]) <= 1 / min(rc.resize_w, rc.resize_h) * 2


def test_resize_crop_refuses_bad_sizes():
    with pytest.raises(ValueError):
        resize_crop(0, 10, 32, 32)


# ----------------------------------------------------------------------------- latent sizes


def test_latent_frames_and_size():
    assert latent_frames(1, 8) == 1
    assert latent_frames(49, 8) == 7
    assert latent_frames(121, 8) == 16
    with pytest.raises(BucketError, match=r"frames 48 is not 1 \+ 8k \(nearest 49 or 41\)"):
        latent_frames(48, 8)
    with pytest.raises(BucketError):
        latent_frames(0, 8)
    assert latent_size(Bucket(768, 448, 89), 32, 8) == (12, 14, 24)  # 4032 tokens, as in LTX docs
    assert math.prod(latent_size(Bucket(768, 448, 89), 32, 8)) == 4032
    with pytest.raises(BucketError, match="width 500"):
        latent_size(Bucket(500, 512, 49), 32, 8)


# ----------------------------------------------------------------------------- frame indices


def test_frame_indices_native():
    assert frame_indices(100, 24.0, 49) == list(range(49))
    assert frame_indices(100, 24.0, 49, start=10) == list(range(10, 59))
    assert frame_indices(49, 24.0, 49) == list(range(49))
    assert frame_indices(48, 24.0, 49) is None
    assert frame_indices(100, 24.0, 49, start=52) is None
    assert frame_indices(100, 24.0, 5, target_fps=24.0) == [0, 1, 2, 3, 4]  # same rate = native


def test_frame_indices_24_to_12():
    idx = frame_indices(100, 24.0, 25, target_fps=12.0)
    assert idx == list(range(0, 49, 2))
    assert frame_indices(48, 24.0, 25, target_fps=12.0) is None  # needs source frame 48
    assert frame_indices(49, 24.0, 25, target_fps=12.0) == idx


def _check_nearest(idx, src_fps, target_fps, start=0):
    for k, i in enumerate(idx):
        t = k / target_fps
        # the chosen source frame is (one of) the nearest to the wanted time
        assert abs((i - start) / src_fps - t) <= 0.5 / src_fps + 1e-9


def test_frame_indices_30_to_24_times():
    idx = frame_indices(100, 30.0, 49, target_fps=24.0)
    assert idx[:9] == [0, 1, 3, 4, 5, 6, 8, 9, 10]
    assert len(set(idx)) == len(idx)  # down-sampling never repeats
    assert idx == sorted(idx) and idx[-1] == 60 and max(idx) < 100
    _check_nearest(idx, 30.0, 24.0)
    # starting later shifts everything
    assert frame_indices(100, 30.0, 49, target_fps=24.0, start=7) == [i + 7 for i in idx]
    assert frame_indices(60, 30.0, 49, target_fps=24.0) is None


def test_frame_indices_ntsc_and_upsample():
    idx = frame_indices(200, 30000 / 1001, 49, target_fps=24.0)
    assert len(set(idx)) == 49
    _check_nearest(idx, 30000 / 1001, 24.0)
    up = frame_indices(100, 12.0, 9, target_fps=24.0)  # up-sampling repeats as needed only
    assert up == [0, 1, 1, 2, 2, 3, 3, 4, 4] or up == [0, 0, 1, 1, 2, 2, 3, 3, 4]
    _check_nearest(up, 12.0, 24.0)


def test_available_frames_matches_frame_indices():
    for n_src in (1, 2, 10, 48, 49, 50, 61, 97):
        for src, tgt in ((24.0, None), (24.0, 12.0), (30.0, 24.0), (30000 / 1001, 24.0), (12.0, 24.0)):
            k = available_frames(n_src, src, tgt)
            assert frame_indices(n_src, src, k, tgt) is not None
            assert frame_indices(n_src, src, k + 1, tgt) is None
    assert available_frames(0, 24.0) == 0
    assert available_frames(10, 24.0, start=10) == 0


def test_effective_fps():
    assert effective_fps(24.0, None) == 24.0
    assert effective_fps(30.0, 24.0) == 24.0
    assert effective_fps(24.0, 24.0000001) == 24.0
    with pytest.raises(ValueError):
        effective_fps(0.0, 24.0)
    with pytest.raises(ValueError):
        frame_indices(10, 24.0, 0)
