"""``decode``: latents back to pictures with the VAE the build recorded, and round-trip PSNR.

Contract
- In: a shardsmith build folder (with ``manifest.json`` and its ledger), an output name
  (default: the first latent output), a destination folder, a sample limit.
- Out: one PNG (1 latent frame) or MP4 (at the stored fps) per sample, mirroring the sample's
  path, plus ``decode_report.json``: per sample its PSNR against the source media after the
  same bucket resize/crop the build applied, and the mean.
- The VAE is rebuilt from the manifest's provenance: ``from_pretrained`` for real weights,
  the same seeded architecture for random weights — then the report says the pictures are
  meaningless and PSNR only checks plumbing.
- Nothing in the build folder is written.
"""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

import numpy as np
import torch

from shardsmith import formats
from shardsmith.encode.vae import load_vae
from shardsmith.loaders.wds import read_member, shard_samples
from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import recipe_from_dict
from shardsmith.sinks.atomic import atomic_write_bytes, atomic_write_json
from shardsmith.sinks.precomputed import LATENTS, mirrored
from shardsmith.transform.buckets import parse_buckets
from shardsmith.transform.latent_pixels import LatentPixelMaker


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two uint8 arrays of one shape (inf when equal)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def _to_uint8(x: torch.Tensor) -> np.ndarray:
    """[3, F, H, W] or [3, H, W] in [-1, 1] -> uint8 [F, H, W, 3]."""
    x = x.float().clamp(-1, 1).add(1).mul(127.5).round().to(torch.uint8)
    if x.ndim == 3:
        x = x[:, None]
    return x.permute(1, 2, 3, 0).cpu().numpy()


def write_media(frames: np.ndarray, fps: float, path: Path) -> Path:
    """uint8 [F, H, W, 3] -> ``path.png`` (one frame) or ``path.mp4`` (libx264, crf 18)."""
    from PIL import Image

    if frames.shape[0] == 1:
        buf = io.BytesIO()
        Image.fromarray(frames[0]).save(buf, format="PNG")
        out = path.with_suffix(".png")
        atomic_write_bytes(out, buf.getvalue())
        return out
    import av

    out = path.with_suffix(".mp4")
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as c:
        s = c.add_stream("libx264", rate=max(1, round(fps)))
        s.width, s.height = frames.shape[2] - frames.shape[2] % 2, frames.shape[1] - frames.shape[1] % 2
        s.pix_fmt, s.options = "yuv420p", {"crf": "18"}
        for f in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f[: s.height, : s.width]),
                                                         format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    atomic_write_bytes(out, buf.getvalue())
    return out


def _vae_from_manifest(manifest: dict[str, Any], recipe) -> Any:
    v = recipe.models.vae
    prov = manifest["models"]["vae"]["provenance"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return load_vae(v.family, pretrained=v.pretrained, subfolder=v.subfolder, revision=v.revision, config=v.config,
                    dtype=v.dtype, device=device, store=v.store), prov["weights"] == "random-weights"


def _latents(root: Path, output: dict[str, Any], split: str) -> Iterator[tuple[str, torch.Tensor, float]]:
    """(sample path, latents [C, F', H', W'] or [C, H', W'], fps) in the output's order."""
    files = output["files"][split]
    folder = root / files["dir"]
    if output["format"] == "precomputed":
        for p in sorted((folder / LATENTS).rglob("*.pt")):
            d = torch.load(p, map_location="cpu", weights_only=True)
            yield p.relative_to(folder / LATENTS).as_posix(), d["latents"], float(d["fps"])
        return
    for shard in files["shards"]:  # only the json and latent.pth members are read, one sample at a time
        path = folder / shard["name"]
        fd = os.open(path, os.O_RDONLY)
        try:
            for _key, refs in shard_samples(path, fd):
                meta = json.loads(read_member(fd, refs["json"], str(path)))
                z = torch.load(io.BytesIO(read_member(fd, refs["latent.pth"], str(path))), map_location="cpu",
                               weights_only=True)
                yield PurePosixPath(meta["path"]).with_suffix(".pt").as_posix(), z, float(meta["fps"])
        finally:
            os.close(fd)


def decode(build_dir: str | Path, out: str | Path, *, output: str | None = None, split: str = "train",
           limit: int | None = None) -> dict[str, Any]:
    root, out = Path(build_dir).resolve(), Path(out).resolve()
    mpath = root / formats.MANIFEST_FILE
    if not mpath.exists():
        raise FileNotFoundError(f"{root} has no {formats.MANIFEST_FILE}; decode reads the models a shardsmith "
                                "build recorded (point it at the build's --out folder)")
    manifest = json.loads(mpath.read_text(encoding="utf-8"))
    if not manifest.get("models"):
        raise ValueError(f"{root} holds no latent outputs (no models in its manifest)")
    recipe = recipe_from_dict(manifest["recipe"], base_dir="/")
    latent_outs = {n: o for n, o in manifest["outputs"].items() if o["format"] in ("precomputed", "latent_wds")}
    name = output or next(iter(latent_outs))
    if name not in latent_outs:
        raise ValueError(f"output {name!r} is not a latent output of this build (have {sorted(latent_outs)})")
    vae, random = _vae_from_manifest(manifest, recipe)
    maker = LatentPixelMaker(parse_buckets(recipe.geometry.buckets), recipe.images, recipe.geometry.fps)
    ledger = Ledger(root / formats.LEDGER_FILE)
    names = [s.name for s in recipe.sources]
    multi = len(recipe.outputs[[o.name for o in recipe.outputs].index(name)].sources or names) > 1
    by_path = {}
    for it in ledger.items(split=split, status="ok"):
        rel = mirrored(it.relpath, names[it.source] if multi else None)
        by_path[rel] = it
        if latent_outs[name]["format"] == "latent_wds":
            by_path[PurePosixPath(it.relpath).with_suffix(".pt").as_posix()] = it
    rows = []
    for i, (rel, z, fps) in enumerate(_latents(root, latent_outs[name], split)):
        if limit is not None and i >= limit:
            break
        with torch.inference_mode():
            pix = vae.decode(z[None].to(vae.device, vae.torch_dtype))[0]
        frames = _to_uint8(pix)
        written = write_media(frames, fps, out / rel)
        row: dict[str, Any] = {"path": rel, "file": written.relative_to(out).as_posix(),
                               "shape": list(frames.shape)}
        item = by_path.get(rel)
        if item is not None:
            src = maker(item)
            if src.pixels is not None and src.pixels.shape == frames.shape:
                row["psnr_db"] = round(psnr(src.pixels, frames), 3)
        rows.append(row)
    ledger.close()
    vals = [r["psnr_db"] for r in rows if "psnr_db" in r and math.isfinite(r["psnr_db"])]
    report = {"build": str(root), "output": name, "split": split, "samples": len(rows),
              "random_weights": random, "mean_psnr_db": round(sum(vals) / len(vals), 3) if vals else None,
              "note": ("the VAE has RANDOM WEIGHTS: the pictures are meaningless and PSNR only proves the "
                       "plumbing round-trips") if random else None, "rows": rows}
    atomic_write_json(out / "decode_report.json", report)
    return report
