"""Video probe / decode / resize on real generated clips (shardsmith.transform.video)."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
import torch

import video_factory as vf
from shardsmith.records import ItemError
from shardsmith.transform.buckets import choose_bucket, frame_indices, parse_buckets, resize_crop
from shardsmith.transform.video import (
    decode_frames,
    probe_video,
    resize_crop_frames,
    to_model_input,
)


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("videos")
    m: dict[str, Path] = {}
    m["pan"] = vf.pan_video(d / "pan.mp4")  # 49 frames, 24 fps, 256x256, no audio
    m["speech"] = vf.pan_video(d / "speech.mp4", frames=24, size=(128, 96), photo="coffee", audio="speech")
    m["tone"] = vf.pan_video(d / "tone.mp4", frames=12, size=(64, 64), photo="camera", audio="tone")
    m["mpeg4"] = vf.pan_video(d / "m30.mp4", frames=45, fps=30, size=(160, 96), photo="chelsea", codec="mpeg4")
    m["rot"] = vf.pan_video(d / "rot.mp4", frames=9, size=(128, 64), photo="rocket", rotation=90)
    m["vfr"], m["vfr_pts"] = vf.vfr_video(d / "vfr.mp4")
    m["mkv"] = vf.pan_video(d / "clip.mkv", frames=20, size=(64, 64))
    m["raw"] = vf.raw_h264_video(d / "clip.h264", frames=20, fps=24)
    m["faststart"] = vf.pan_video(d / "fs.mp4", faststart=True)
    m["trunc"] = vf.truncated_video(m["pan"], d / "trunc.mp4")
    m["trunc_fs"] = vf.truncated_video(m["faststart"], d / "trunc_fs.mp4")
    m["lying"] = vf.lying_metadata_video(d / "lying.mp4", frames=49, keep=0.5)
    m["text"] = vf.text_as_mp4(d / "caption.mp4")
    m["audio_only"] = vf.audio_only_file(d / "voice.m4a")
    (d / "empty.mp4").write_bytes(b"")
    m["empty"] = d / "empty.mp4"
    # corrupt the middle of a faststart file's media data (keeps the index intact)
    data = bytearray(m["faststart"].read_bytes())
    at = data.find(b"mdat") + (len(data) - data.find(b"mdat")) // 3
    data[at : at + 3000] = np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes()
    m["corrupt"] = d / "corrupt.mp4"
    m["corrupt"].write_bytes(bytes(data))
    return m


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 10 * np.log10(255.0**2 / max(mse, 1e-12))


def _pyav_frames(path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


# ----------------------------------------------------------------------------- probe


def test_probe_plain_clip(media):
    p = probe_video(media["pan"], "pan")
    assert (p.width, p.height, p.frames, p.fps) == (256, 256, 49, 24.0)
    assert p.frames_source == "metadata"
    assert p.duration == pytest.approx(49 / 24, abs=1e-3)
    assert p.codec == "h264"
    assert not p.has_audio and p.audio_channels is None and p.audio_rate is None
    assert p.rotation == 0 and not p.vfr and not p.truncated
    assert p.notes == []
    assert isinstance(p.fps, float)


def test_probe_audio_tracks(media):
    p = probe_video(media["speech"], "speech")
    assert (p.width, p.height, p.frames, p.fps) == (128, 96, 24, 24.0)
    assert p.has_audio and p.audio_channels == 2 and p.audio_rate == 16000
    t = probe_video(media["tone"], "tone")
    assert t.has_audio and t.frames == 12
    # the audio is really there and as long as the clip
    with av.open(str(media["speech"])) as c:
        samples = np.concatenate([f.to_ndarray()[0] for f in c.decode(audio=0)])
    assert samples.shape[0] >= 16000 * 1.0 * 0.9
    assert 0.02 < float(np.sqrt(np.mean(samples**2))) < 0.6


def test_probe_other_codec_and_rate(media):
    p = probe_video(media["mpeg4"], "m30")
    assert (p.codec, p.fps, p.frames, p.width, p.height) == ("mpeg4", 30.0, 45, 160, 96)
    assert not p.vfr


def test_probe_rotation_swaps_displayed_size(media):
    p = probe_video(media["rot"], "rot")
    assert p.rotation == 90
    assert (p.coded_width, p.coded_height) == (128, 64)
    assert (p.width, p.height) == (64, 128)
    frames = decode_frames(media["rot"], [0, 8], "rot")
    assert frames.shape == (2, p.height, p.width, 3)
    raw = decode_frames(media["rot"], [0], "rot", autorotate=False)
    assert raw.shape == (1, 64, 128, 3)
    assert np.array_equal(np.rot90(raw[0]), frames[0])


def test_probe_vfr(media):
    p = probe_video(media["vfr"], "vfr")
    assert p.vfr is True
    assert p.frames == 40
    pts = media["vfr_pts"]
    assert p.fps == pytest.approx((len(pts) - 1) / (pts[-1] / 1000), rel=0.1)  # average rate
    assert any("variable frame rate" in n for n in p.notes)


def test_probe_frame_count_fallbacks(media):
    mkv = probe_video(media["mkv"], "mkv")  # Matroska stores no frame count
    assert (mkv.frames, mkv.frames_source, mkv.fps, mkv.vfr) == (20, "duration", 24.0, False)
    raw = probe_video(media["raw"], "raw")  # no count, no duration: count packets
    assert (raw.frames, raw.frames_source, raw.fps, raw.vfr) == (20, "packets", 24.0, False)
    assert raw.duration == pytest.approx(20 / 24)
    assert decode_frames(media["raw"], list(range(20)), "raw").shape == (20, 64, 64, 3)


def test_probe_truncated_faststart_flags_it(media):
    p = probe_video(media["trunc_fs"], "tfs")
    assert p.truncated and p.frames == 49 and not p.vfr


@pytest.mark.parametrize(
    "key, reason",
    [
        ("text", "not_a_video"),
        ("empty", "empty_file"),
        ("audio_only", "no_video_stream"),
        ("trunc", "truncated"),  # moov index was at the end: cut off
    ],
)
def test_probe_bad_files(media, key, reason):
    with pytest.raises(ItemError) as ei:
        probe_video(media[key], f"src/{key}")
    e = ei.value
    assert e.reason == reason and e.status == f"failed:{reason}"
    assert f"src/{key}" in e.detail


def test_probe_missing_file(tmp_path):
    with pytest.raises(ItemError) as ei:
        probe_video(tmp_path / "nope.mp4", "src/nope")
    assert ei.value.reason == "unreadable" and "src/nope" in ei.value.detail


def test_probe_lying_metadata(media):
    p = probe_video(media["lying"], "lying")
    assert p.frames == 49 and p.frames_source == "metadata"  # the container still claims 49
    assert p.truncated is True
    assert any("truncated" in n for n in p.notes)


# ----------------------------------------------------------------------------- decode


def test_decode_exact_frames_match_pyav(media):
    ref = _pyav_frames(media["pan"])
    assert len(ref) == 49
    got = decode_frames(media["pan"], [0, 5, 5, 48], "pan")
    assert got.shape == (4, 256, 256, 3) and got.dtype == np.uint8
    assert np.array_equal(got[0], ref[0])
    assert np.array_equal(got[1], ref[5]) and np.array_equal(got[2], ref[5])
    assert np.array_equal(got[3], ref[48])


def test_decode_content_is_the_photo(media):
    src = vf.pan_frames(49, (256, 256), "astronaut")
    got = decode_frames(media["pan"], list(range(0, 49, 6)), "pan")
    for j, i in enumerate(range(0, 49, 6)):
        assert _psnr(got[j], src[i]) > 28  # x264 crf 23 on a real photo
        # and it is *that* frame of the pan, not a neighbour
        for other in (i - 3, i + 3):
            if 0 <= other < 49:
                assert _psnr(got[j], src[i]) > _psnr(got[j], src[other]) + 3
    assert 60 < got.mean() < 200 and got.std() > 30  # a photo, not a flat or black frame


def test_decode_resampled_indices(media):
    idx = frame_indices(45, 30.0, 33, target_fps=24.0)
    assert idx is not None and idx[-1] == 40
    got = decode_frames(media["mpeg4"], idx, "m30")
    ref = _pyav_frames(media["mpeg4"])
    assert got.shape == (33, 96, 160, 3)
    for j, i in enumerate(idx):
        assert np.array_equal(got[j], ref[i])


def test_decode_lying_metadata_is_skipped_not_crashed(media):
    with pytest.raises(ItemError) as ei:
        decode_frames(media["lying"], list(range(49)), "src/lying")
    e = ei.value
    assert e.reason == "too_short" and e.skip and e.status == "skipped:too_short"
    assert "metadata said 49" in e.detail and "src/lying" in e.detail
    n = int(e.detail.split("decoded only ")[1].split()[0])
    assert 0 < n < 49
    # the frames that are really there still decode
    assert decode_frames(media["lying"], list(range(9)), "src/lying").shape == (9, 256, 256, 3)


def test_decode_truncated_never_raises_ffmpeg_errors(media):
    # index at the start, data cut at 50%: the decodable part is too short -> skipped
    with pytest.raises(ItemError) as ei:
        decode_frames(media["trunc_fs"], list(range(49)), "src/trunc_fs")
    assert ei.value.status in ("skipped:too_short", "failed:decode_error")
    # index at the end, cut off: cannot even open -> failed:truncated
    with pytest.raises(ItemError) as ei:
        decode_frames(media["trunc"], [0], "src/trunc")
    assert ei.value.status == "failed:truncated"
    assert "re-copy" in ei.value.detail


def test_decode_corrupt_mid_stream(media):
    with pytest.raises(ItemError) as ei:
        decode_frames(media["corrupt"], list(range(49)), "src/corrupt")
    assert ei.value.status == "failed:decode_error"
    assert "src/corrupt" in ei.value.detail


def test_decode_too_short_plain_clip(media):
    with pytest.raises(ItemError) as ei:
        decode_frames(media["tone"], list(range(13)), "tone")
    assert ei.value.status == "skipped:too_short"
    assert "decoded only 12 frames (metadata said 12)" in ei.value.detail


@pytest.mark.parametrize(
    "key, reason", [("text", "not_a_video"), ("empty", "empty_file"), ("audio_only", "no_video_stream")]
)
def test_decode_bad_files(media, key, reason):
    with pytest.raises(ItemError) as ei:
        decode_frames(media[key], [0], key)
    assert ei.value.reason == reason


def test_decode_refuses_bad_indices(media):
    with pytest.raises(ValueError):
        decode_frames(media["pan"], [], "pan")
    with pytest.raises(ValueError):
        decode_frames(media["pan"], [-1], "pan")


# ----------------------------------------------------------------------------- pixels


def test_bucket_resize_crop_and_model_input(media):
    p = probe_video(media["mpeg4"], "m30")  # 160x96, 45 frames
    buckets = parse_buckets("64x64x25;96x64x33;96x64x49;64x96x33")
    b = choose_bucket(p.width, p.height, p.frames, buckets)
    assert str(b) == "96x64x33"  # 160/96 = 1.67 closest to 1.5; 49 frames ineligible
    idx = frame_indices(p.frames, p.fps, b.frames)
    frames = decode_frames(media["mpeg4"], idx, "m30")
    rc = resize_crop(p.width, p.height, b.width, b.height)
    assert (rc.resize_w, rc.resize_h, rc.crop_x0, rc.crop_y0) == (107, 64, 5, 0)
    out = resize_crop_frames(frames, rc)
    assert out.shape == (33, 64, 96, 3) and out.dtype == np.uint8
    # compare to PIL applied by hand on one frame
    from PIL import Image

    want = np.asarray(Image.fromarray(frames[7]).resize((107, 64), Image.BICUBIC))[0:64, 5:101]
    assert np.array_equal(out[7], want)
    x = to_model_input(out)
    assert x.shape == (3, 33, 64, 96) and x.dtype == torch.float32
    assert x.min() >= -1.0 and x.max() <= 1.0
    assert torch.equal(x[:, 7].permute(1, 2, 0), torch.from_numpy(out[7]).float() / 127.5 - 1)
    assert x.is_contiguous()


def test_resize_crop_frames_refuses_wrong_source(media):
    frames = decode_frames(media["rot"], [0], "rot")  # displayed 64x128
    wrong = resize_crop(128, 64, 32, 32)  # computed for the coded (unrotated) size
    with pytest.raises(ValueError, match="computed for another size"):
        resize_crop_frames(frames, wrong)
    ok = resize_crop(64, 128, 32, 32)
    assert resize_crop_frames(frames, ok).shape == (1, 32, 32, 3)
    # identity resize is a pure crop
    same = resize_crop(64, 128, 64, 128)
    assert np.array_equal(resize_crop_frames(frames, same), frames)


def test_to_model_input_range():
    f = np.array([0, 255, 127], np.uint8).reshape(1, 1, 1, 3)
    x = to_model_input(f)
    assert x.shape == (3, 1, 1, 1)
    assert x.flatten().tolist() == pytest.approx([-1.0, 1.0, 127 / 127.5 - 1])
    with pytest.raises(ValueError):
        to_model_input(np.zeros((2, 2, 3), np.uint8))


def test_resize_crop_image_is_bit_identical_to_the_frames_path():
    """Images skip the numpy round trip (resize the PIL image itself): same bytes as before."""
    from PIL import Image
    from skimage import data

    from shardsmith.transform.video import resize_crop_image

    for photo, (cw, ch) in [(data.astronaut(), (256, 256)), (data.coffee(), (128, 96)), (data.chelsea(), (96, 160)),
                            (data.rocket(), (427, 640)[::-1])]:
        img = Image.fromarray(photo)
        rc = resize_crop(img.width, img.height, cw, ch)
        want = resize_crop_frames(np.asarray(img)[None], rc)[0]
        got = resize_crop_image(img, rc)
        assert got.shape == (ch, cw, 3) and got.dtype == np.uint8 and np.array_equal(got, want)
    same = resize_crop(img.width, img.height, img.width, img.height)  # no resize: a plain crop
    assert np.array_equal(resize_crop_image(img, same), np.asarray(img))
    with pytest.raises(ValueError, match="computed for another size"):
        resize_crop_image(img, resize_crop(img.width + 50, img.height, 64, 64))
