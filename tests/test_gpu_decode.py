"""GPU image decode (``images.decoder``), checked on the CPU: which JPEGs the workers pass on undecoded,
EXIF orientation and resampling against Pillow, failures, and a whole build with the decoder's
place taken by a CPU stand-in (nvJPEG itself needs a GPU: BENCHMARKS.md §5 has the H200 runs)."""

import io
import json
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import torch
import yaml
from PIL import Image, ImageCms, ImageOps

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.encode import decoder_choice, gpu_decode
from shardsmith.encode.gpu_decode import StagedImages, decode_rows, orient, resize_crop
from shardsmith.records import ItemError
from shardsmith.recipe import recipe_from_dict
from shardsmith.transform.jpeg_pass import EncodedImage, exif_orientation, gpu_refusal, upright_size


def pil_decode(datas, device):
    """A CPU stand-in for nvJPEG: the JPEG's pixels as stored ([3, H, W], no EXIF rotation)."""
    out = []
    for d in datas:
        img = Image.open(io.BytesIO(bytes(d.numpy()))).convert("RGB")
        out.append(torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).to(device))
    return out


def jpeg(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=92, **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return real_photos(tmp_path_factory.mktemp("ph"), 6, min_side=180, max_side=420)


def test_plain_jpegs_pass_and_others_are_refused_with_the_reason(photos):
    rgb = Image.open(photos[0])
    data = photos[0].read_bytes()
    assert gpu_refusal(Image.open(io.BytesIO(data)), data) is None
    grey = jpeg(rgb.convert("L"))
    assert gpu_refusal(Image.open(io.BytesIO(grey)), grey) is None
    png = io.BytesIO()
    rgb.save(png, format="PNG")
    assert "PNG" in gpu_refusal(Image.open(io.BytesIO(png.getvalue())), png.getvalue())
    cmyk = jpeg(rgb.convert("CMYK"))
    assert "CMYK" in gpu_refusal(Image.open(io.BytesIO(cmyk)), cmyk)
    trailer = data + b"\x01\x02\x03trailer"  # bytes after the end-of-image marker: still a whole JPEG
    assert gpu_refusal(Image.open(io.BytesIO(trailer)), trailer) is None
    cut = data[: len(data) // 2]
    assert "end-of-image" in gpu_refusal(Image.open(io.BytesIO(cut)), cut)
    lab = ImageCms.ImageCmsProfile(ImageCms.createProfile("LAB"))
    tagged = jpeg(rgb, icc_profile=lab.tobytes())
    assert "colour profile" in gpu_refusal(Image.open(io.BytesIO(tagged)), tagged)
    srgb = jpeg(rgb, icc_profile=ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes())
    assert gpu_refusal(Image.open(io.BytesIO(srgb)), srgb) is None


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_matches_pils_exif_transpose(photos, orientation):
    img = Image.open(photos[1]).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = jpeg(img, exif=exif.tobytes())
    opened = Image.open(io.BytesIO(data))
    assert exif_orientation(opened) == orientation
    want = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data)).convert("RGB")))
    stored = pil_decode([torch.frombuffer(bytearray(data), dtype=torch.uint8)], "cpu")[0]
    got = orient(stored, orientation).permute(1, 2, 0).numpy()
    assert got.shape == want.shape and (got == want).all()
    assert upright_size(*opened.size, orientation) == (want.shape[1], want.shape[0])


def test_resampling_is_within_rounding_of_pils_bicubic(photos):
    """The GPU path's resize (torch's antialiased bicubic) against the CPU path's (Pillow's bicubic):
    the README's statement of how far the pixels may differ rests on these bounds."""
    from shardsmith.transform.buckets import resize_crop as cover

    for p, (cw, ch) in zip(photos, [(64, 64), (96, 64), (64, 96), (128, 128), (256, 256), (64, 64)]):
        img = Image.open(p).convert("RGB")
        rc = cover(*img.size, cw, ch)
        want = np.asarray(img.resize((rc.resize_w, rc.resize_h), Image.BICUBIC).crop(rc.box)).astype(int)
        chw = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)
        got = resize_crop(chw, (rc.resize_w, rc.resize_h), rc.box).numpy().astype(int)
        diff = np.abs(got - want)
        assert got.shape == want.shape == (ch, cw, 3)
        assert diff.mean() < 0.6 and np.percentile(diff, 99) <= 3, (p.name, diff.mean(), diff.max())


def _encoded(path, box=(0, 0, 64, 64), resize=None) -> EncodedImage:
    img = Image.open(path)
    from shardsmith.transform.buckets import resize_crop as cover

    rc = cover(*img.size, box[2] - box[0], box[3] - box[1])
    return EncodedImage(path.read_bytes(), 1, img.size, resize or (rc.resize_w, rc.resize_h), rc.box, path.name,
                        10 ** 9, (255, 255, 255))


def test_a_jpeg_no_decoder_reads_fails_its_row_alone(photos, monkeypatch):
    calls = []

    def picky(datas, device):
        calls.append(len(datas))
        if any(bytes(d[:4].numpy()) != b"\xff\xd8\xff\xe0" for d in datas):
            raise RuntimeError("nvjpeg: bad bitstream")
        return pil_decode(datas, device)

    monkeypatch.setattr(gpu_decode, "DECODE", picky)
    good = [_encoded(p) for p in photos[:3]]
    bad = EncodedImage(b"\xff\xd8\xff\xdbnot a jpeg at all\xff\xd9", 1, (64, 64), (64, 64), (0, 0, 64, 64), "bad.jpg",
                       10 ** 9, (255, 255, 255))
    pixels = np.full((1, 64, 64, 3), 7, np.uint8)  # a row decoded on the CPU already (a PNG, say)
    staged = StagedImages([good[0], bad, pixels, good[1], good[2]])
    out = decode_rows(staged[1:5], "cpu")  # a slice (out-of-memory halving) reports to the whole batch
    assert out.shape == (4, 64, 64, 3) and out.dtype == torch.uint8
    assert list(staged.failed) == [1] and isinstance(staged.failed[1], ItemError)
    assert staged.failed[1].status.startswith("failed:") and "bad.jpg" in staged.failed[1].detail
    assert (out[0] == 0).all() and (out[1] == 7).all()
    assert calls[0] == 3 and calls[1:] == [1, 1, 1]  # the batch, then one by one
    want = resize_crop(pil_decode([torch.frombuffer(bytearray(good[1].data), dtype=torch.uint8)], "cpu")[0],
                       good[1].resize, good[1].box)
    assert (out[2] == want).all()


@pytest.mark.slow
def test_decoder_gpu_without_a_gpu_exits_2_before_any_work(tmp_path, photos):
    recipe = {"sources": [{"path": str(photos[0].parent)}], "geometry": {"buckets": ["64x64x1"]},
              "images": {"decoder": "gpu"}, "models": {"vae": {"family": "sd"}, "device": "cpu"},
              "outputs": [{"format": "latent_wds"}]}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    r = subprocess.run([sys.executable, "-m", "shardsmith", "build", str(tmp_path / "r.yaml"), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "images.decoder is gpu" in r.stderr and "images.decoder: auto" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def _members(out):
    got = {}
    for shard in sorted((out / "lat").glob("**/*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf.getmembers():
                got[m.name] = tf.extractfile(m).read()
    return got


@pytest.mark.slow
def test_build_with_the_gpu_decoder_path_matches_the_cpu_path(tmp_path_factory, monkeypatch):
    """The whole path of ``images.decoder: gpu`` (workers pass JPEGs on, the stage decodes a batch,
    orients, resizes, crops) with a CPU stand-in for nvJPEG: same samples, latents within the
    resampling difference, the decoder in the manifest; PNGs and CMYK JPEGs beside them take the CPU path."""
    src = tmp_path_factory.mktemp("src")
    paths = real_photos(src, 10, min_side=150, max_side=400)
    img = Image.open(paths[0]).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = 6
    (src / "rotated.jpg").write_bytes(jpeg(img, exif=exif.tobytes()))
    img.save(src / "lossless.png")
    (src / "cmyk.jpg").write_bytes(jpeg(img.convert("CMYK")))
    recipe = lambda: recipe_from_dict({  # noqa: E731
        "sources": [{"path": str(src)}], "geometry": {"buckets": ["64x64x1", "96x64x1", "64x96x1"]},
        "models": {"vae": {"family": "sd", "dtype": "float32"}, "batch_size": 4, "device": "cpu"},
        "outputs": [{"format": "latent_wds", "dir": "lat", "samples_per_shard": 5}]})
    cpu_out = tmp_path_factory.mktemp("cpu") / "out"
    cpu = build(recipe(), cpu_out, quiet=True, workers=2)
    decoded = []
    monkeypatch.setattr(gpu_decode, "DECODE", lambda datas, dev: decoded.append(len(datas)) or pil_decode(datas, dev))
    monkeypatch.setattr(decoder_choice, "resolve_decoder", lambda setting, device, workers=8: "gpu")  # as on a GPU
    out = tmp_path_factory.mktemp("gpu") / "out"
    gpu = build(recipe(), out, quiet=True, workers=2)
    assert gpu["outputs"]["latent_wds"]["counts"] == cpu["outputs"]["latent_wds"]["counts"]
    assert gpu["outputs"]["latent_wds"]["counts"]["written"] == 13
    assert sum(decoded) == 11  # the 10 photos and the rotated one on the device; the PNG and CMYK JPEG not
    assert gpu["models"]["image_decoder"] == "nvjpeg" and "image_decoder" not in cpu["models"]
    a, b = _members(cpu_out), _members(out)
    assert sorted(a) == sorted(b) and len([k for k in a if k.endswith(".latent.pth")]) == 13
    for k in a:
        if k.endswith(".latent.pth") and k.startswith("cmyk"):  # CPU path, at the DCT scale (cpu-draft)
            assert torch.load(io.BytesIO(a[k])).shape == torch.load(io.BytesIO(b[k])).shape
        elif k.endswith(".latent.pth"):
            za, zb = torch.load(io.BytesIO(a[k])), torch.load(io.BytesIO(b[k]))
            assert za.shape == zb.shape and za.dtype == zb.dtype
            assert (za - zb).abs().mean() < 0.02 * za.abs().mean() + 1e-3, k
        if k.endswith(".json"):
            ja, jb = json.loads(a[k]), json.loads(b[k])
            assert ja["crop"] == jb["crop"] and ja["source_size"] == jb["source_size"], k
    again = tmp_path_factory.mktemp("gpu2") / "out"
    build(recipe(), again, quiet=True, workers=2)
    assert _members(again) == b  # the same bytes on every run


@pytest.mark.skipif(not torch.cuda.is_available() or gpu_decode.gpu_decoder_problem() is not None,
                    reason="needs a CUDA device and torchvision's nvJPEG decoder")
def test_nvjpeg_on_the_gpu_is_within_the_readmes_bounds_of_the_cpu_path(photos):
    """On a GPU machine: real nvJPEG, every EXIF orientation, against the CPU path's pixels."""
    from shardsmith.transform.buckets import resize_crop as cover

    rows, want = [], []
    for i, p in enumerate(photos):
        img = Image.open(p).convert("RGB")
        exif = Image.Exif()
        exif[0x0112] = i % 8 + 1
        data = jpeg(img, exif=exif.tobytes())
        up = ImageOps.exif_transpose(Image.open(io.BytesIO(data)).convert("RGB"))
        rc = cover(*up.size, 128, 96)
        rows.append(EncodedImage(data, i % 8 + 1, up.size, (rc.resize_w, rc.resize_h), rc.box, p.name, 10 ** 9,
                                 (255, 255, 255)))
        want.append(np.asarray(up.resize((rc.resize_w, rc.resize_h), Image.BICUBIC).crop(rc.box)))
    staged = StagedImages(rows)
    got = decode_rows(staged, "cuda").cpu().numpy().astype(int)
    diff = np.abs(got - np.stack(want).astype(int))
    assert not staged.failed and got.shape == (len(photos), 96, 128, 3)
    assert diff.mean() < 1.5 and np.percentile(diff, 99) <= 8, (diff.mean(), np.percentile(diff, 99), diff.max())


def _item(path, i=0):
    from shardsmith.records import PlannedItem

    return PlannedItem(idx=i, item_id=path.name, key=f"k{i}", source=0, path=str(path), relpath=path.name, caption=None,
                       label=None, label_name=None, meta={}, sha256=None, size_bytes=path.stat().st_size, kind="image",
                       width=None, height=None, image_format="JPEG", mode="RGB", split="train", plan_status="ok")


@pytest.mark.parametrize("orientation", [1, 6])
def test_cpu_draft_decodes_large_photos_at_a_dct_scale_close_to_the_full_decode(tmp_path, orientation):
    """``images.decoder: cpu-draft``: a photo shrunk 4x or more is decoded at a DCT scale that keeps twice
    the resize (Pillow's draft), then resized: the same geometry, pixels close to the full decode's; a
    photo shrunk less is decoded in full (the same bytes)."""
    from shardsmith.recipe import ImageRules
    from shardsmith.transform.buckets import parse_buckets
    from shardsmith.transform.latent_pixels import LatentPixelMaker

    paths = real_photos(tmp_path / "big", 3, min_side=1100, max_side=1600, seed=3)
    exif = Image.Exif()
    exif[0x0112] = orientation
    rotated = tmp_path / "rot.jpg"
    rotated.write_bytes(jpeg(Image.open(paths[0]), exif=exif.tobytes()))
    full = LatentPixelMaker(parse_buckets(["128x128x1", "256x256x1"]), ImageRules())
    draft = LatentPixelMaker(parse_buckets(["128x128x1", "256x256x1"]), ImageRules(), decoder="cpu-draft")
    for bucket in ("128x128x1",):
        for p in [*paths, rotated]:
            assert draft.jpeg_header(_item(p), p.read_bytes()).draft is not None
            a, b = full(_item(p)), draft(_item(p))
            assert a.status == b.status == "written" and a.info == b.info
            d = np.abs(a.pixels.astype(int) - b.pixels.astype(int))
            assert a.pixels.shape == b.pixels.shape and 0 < d.mean() < 1.5 and np.percentile(d, 99) <= 12
    only = LatentPixelMaker(parse_buckets(["512x512x1"]), ImageRules(), decoder="cpu-draft")
    assert only.jpeg_header(_item(paths[1]), paths[1].read_bytes()).draft is None  # shrunk less than 4x: decoded in full
    exact = LatentPixelMaker(parse_buckets(["512x512x1"]), ImageRules())
    assert (only(_item(paths[1])).pixels == exact(_item(paths[1])).pixels).all()


def test_a_build_keeps_the_decoder_it_began_with(tmp_path, monkeypatch):
    """``images.decoder: auto`` is settled once and kept in the ledger: a resumed build decodes as it
    began, whatever the machine would choose now; a ledger with results and no record is an older build
    (``cpu``); a build begun on the GPU cannot resume without one (exit 2's message names why)."""
    from shardsmith.plan.ledger import Ledger
    from shardsmith.precheck import DeviceError

    recipe = recipe_from_dict({"sources": [{"path": "x"}], "geometry": {"buckets": ["64x64x1"]},
                               "models": {"vae": {"family": "sd"}, "device": "cpu"},
                               "outputs": [{"format": "latent_wds"}]})
    led = Ledger(tmp_path / "a.sqlite")
    assert decoder_choice.settle(recipe, led, 8).images.decoder == "cpu"  # encoders on the CPU
    assert led.get_meta("image_decoder") == "cpu"
    monkeypatch.setattr(decoder_choice, "resolve_decoder", lambda s, d, w=8: "cpu-draft")  # as a GPU machine would
    assert decoder_choice.settle(recipe, led, 8).images.decoder == "cpu"  # kept
    fresh = Ledger(tmp_path / "b.sqlite")
    settled = decoder_choice.settle(recipe, fresh, 8)
    assert settled.images.decoder == "cpu-draft" and recipe.images.decoder == "auto"  # the caller's untouched
    old = Ledger(tmp_path / "c.sqlite")
    monkeypatch.setattr(old, "has_results", lambda: True)
    assert decoder_choice.settle(recipe, old, 8).images.decoder == "cpu"
    monkeypatch.undo()
    gpu = Ledger(tmp_path / "d.sqlite")
    gpu.set_meta("image_decoder", "gpu")
    with pytest.raises(DeviceError, match="began decoding JPEGs on the GPU"):
        decoder_choice.settle(recipe, gpu, 8)  # resumed with the encoders on the CPU
    assert decoder_choice.resolve_decoder("auto", "cuda", 14) in ("cpu-draft", "gpu")
    assert decoder_choice.resolve_decoder("auto", "cuda", 14) == "cpu-draft"
    assert decoder_choice.resolve_decoder("auto", "cpu", 2) == "cpu"


def test_auto_with_enough_decode_workers_settles_without_importing_the_gpu_decoder(monkeypatch):
    """torchvision's import takes seconds at the start of every GPU build: asked only where it decides."""
    calls = []
    monkeypatch.setattr(gpu_decode, "DECODE", gpu_decode._torchvision_decode)
    monkeypatch.setattr(gpu_decode, "gpu_decoder_problem", lambda: calls.append("asked"))
    assert decoder_choice.resolve_decoder("auto", "cuda", 8) == "cpu-draft" and calls == []
    assert decoder_choice.resolve_decoder("auto", "cpu", 2) == "cpu" and calls == []
    assert decoder_choice.resolve_decoder("auto", "cuda", 2) == "gpu" and calls == ["asked"]
