"""Shared helpers of ``bench/loader.py`` and ``bench/verify_speed.py``.

* dataset preparation (cached in a work folder, re-made only when the arguments change):
  - images: ``tests/media_factory.real_photos`` JPEGs + a ``.txt`` caption sidecar each,
    built into WebDataset shards by ``shardsmith.build`` (jpg max_side 256);
  - latents: ``latent.pth`` + ``txt_emb.pth`` samples written with ``webdataset.TarWriter``,
    plus ``shard_count.json`` and a ``neg_prompt_emb.npy`` (for the ``image_latent`` preset);
    two sizes (``LATENT_SHAPES``): ``small`` float32 [4,32,32] + bfloat16 [77,64] (33 kB a
    sample) and ``sdxl`` float32 [4,128,128] + bfloat16 [77,2048] (578 kB a sample: the SDXL
    shapes of reference/fastgen.md, 1024² images with CLIP-L+G embeddings);
* measurement helpers copied from ``bench/reshard.py`` (own CPU incl. joined children,
  machine-wide busy CPU from /proc/stat, waiting for a quiet machine), plus a page-cache
  helper (read everything / evict our own files with ``posix_fadvise(DONTNEED)``).
"""

from __future__ import annotations

import io
import json
import os
import resource
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
from _media import cpu_now, machine_info, real_photos, system_busy, wait_quiet  # noqa: E402,F401

DEFAULT_WORK = Path("/tmp/ss-loader-bench")
CHUNK = 8 << 20


# --------------------------------------------------------------------------- datasets
def prepare_images(work: Path, n: int, *, min_side: int = 200, max_side: int = 400,
                   per_shard: int = 250) -> Path:
    """WDS shards (jpg + txt + json members) built by shardsmith; returns the shard folder."""
    from shardsmith.build import build
    from shardsmith.recipe import recipe_from_dict

    src = work / f"photos_{n}_{min_side}-{max_side}"
    paths = real_photos(src, n, seed=0, min_side=min_side, max_side=max_side)
    for p in paths:
        cap = p.with_suffix(".txt")
        if not cap.exists():
            cap.write_text(f"a real photo number {p.stem.split('_')[-1]}, cropped and rescaled")
    out = work / f"img_build_{n}_{min_side}-{max_side}_{per_shard}"
    recipe = recipe_from_dict({"sources": [{"path": str(src)}],
                               "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": per_shard,
                                            "image": {"format": "jpg", "max_side": 256}}]}, base_dir=".")
    marker = work / f".{out.name}.bench-done"
    if marker.is_file() and (out / "wds" / "shard_count.json").is_file():
        return out / "wds"  # built earlier by this helper (shardsmith's own fingerprint may move with src/)
    t0 = time.perf_counter()
    build(recipe, out, quiet=True, overwrite=True)
    marker.write_text("ok")
    print(f"# built {n} photos into {out / 'wds'} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return out / "wds"


LATENT_SHAPES = {"small": ((4, 32, 32), (77, 64)), "sdxl": ((4, 128, 128), (77, 2048))}


def prepare_latents(work: Path, n: int, *, per_shard: int = 1000, seed: int = 0, name: str | None = None,
                    shape: str = "small") -> Path:
    """Latent WDS written by plain webdataset (not shardsmith); returns the shard folder."""
    import numpy as np
    import torch
    import webdataset as wds

    lat_shape, emb_shape = LATENT_SHAPES[shape]
    root = work / (name or (f"latents_{n}_{per_shard}" + ("" if shape == "small" else f"_{shape}")))
    marker = root / ".bench-latents.json"
    want = {"n": n, "per_shard": per_shard, "seed": seed, "v": 1}
    if shape != "small":
        want["shape"] = shape
    if marker.is_file() and json.loads(marker.read_text()) == want:
        return root
    t0 = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    for p in root.iterdir():
        p.unlink()
    g = torch.Generator().manual_seed(seed)
    counts: dict[str, int] = {}
    i = 0
    shard = 0
    while i < n:
        name_ = f"{shard:05d}.tar"
        k = min(per_shard, n - i)
        with wds.TarWriter(str(root / name_)) as w:
            for _ in range(k):
                lat, emb = io.BytesIO(), io.BytesIO()
                torch.save(torch.randn(*lat_shape, generator=g), lat)
                torch.save(torch.randn(*emb_shape, generator=g).to(torch.bfloat16), emb)
                w.write({"__key__": f"sample{i:08d}", "latent.pth": lat.getvalue(), "txt_emb.pth": emb.getvalue()})
                i += 1
        counts[name_] = k
        shard += 1
    (root / "shard_count.json").write_text(json.dumps(counts))
    np.save(root / "neg_prompt_emb.npy", np.zeros(emb_shape, dtype=np.float32))
    marker.write_text(json.dumps(want))
    print(f"# wrote {n} latent samples ({shard} shards) into {root} in {time.perf_counter() - t0:.1f}s",
          file=sys.stderr)
    return root


def subset(folder: Path, k: int) -> Path:
    """A sibling folder holding symlinks to the first ``k`` shards of ``folder`` and the
    matching ``shard_count.json`` (+ ``neg_prompt_emb.npy`` when present); ``k <= 0``: all."""
    shards = shard_paths(folder)
    if k <= 0 or k >= len(shards):
        return folder
    dest = folder.parent / f"{folder.name}__first{k}" if folder.name != "wds" else \
        folder.parent.parent / f"{folder.parent.name}__first{k}"
    dest.mkdir(parents=True, exist_ok=True)
    for p in dest.iterdir():
        p.unlink()
    counts = json.loads((folder / "shard_count.json").read_text())
    for p in shards[:k]:
        (dest / p.name).symlink_to(p)
    (dest / "shard_count.json").write_text(json.dumps({p.name: counts[p.name] for p in shards[:k]}))
    if (folder / "neg_prompt_emb.npy").exists():
        (dest / "neg_prompt_emb.npy").symlink_to(folder / "neg_prompt_emb.npy")
    return dest


def shard_paths(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.tar"))


def dataset_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in shard_paths(folder))


# --------------------------------------------------------------------------- page cache
def plain_read(paths: list[Path], chunk: int = CHUNK) -> int:
    """``cat``-like: read every file fully in ``chunk``-byte reads, one process."""
    n = 0
    buf = bytearray(chunk)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while True:
                k = f.readinto(buf)
                if not k:
                    break
                n += k
    return n


def evict(paths: list[Path]) -> None:
    """Drop OUR files' pages from the page cache (no effect on anything else on the machine)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------- measurement (from bench/reshard.py)


class Meter:
    """Wall time of the timed region; own CPU and other processes' load over the whole
    region including any shutdown (call :meth:`stop` at the end of the timed region and
    :meth:`close` once child processes are joined)."""

    def __enter__(self):
        self.b0, self.c0 = system_busy(), cpu_now()
        self.t0 = time.perf_counter()
        self.dt = None
        return self

    def stop(self) -> None:
        if self.dt is None:
            self.dt = time.perf_counter() - self.t0

    def __exit__(self, *exc):
        self.stop()
        total = time.perf_counter() - self.t0
        self.cpu = cpu_now() - self.c0
        busy = system_busy() - self.b0
        self.other = max(0.0, busy - self.cpu) / max(total, 1e-9)  # cores used by other processes
        return False


def header(info: dict) -> str:
    return (f"# machine: nproc={info['nproc']} cpu={info['cpu']!r} ram={info['ram_gib']} GiB "
            f"python={info['python']} date={info['date']}")


def median(xs):
    import statistics

    return statistics.median(xs) if xs else float("nan")
