"""Test-photo generation shared by the benchmarks in ``bench/``.

Uses ``tests/media_factory.real_photos`` (real photos cropped/rescaled from the sample
images shipped with scikit-image / matplotlib). If that module cannot be imported, falls
back to a minimal local equivalent (seeded random crops of skimage sample photos).
A folder is generated once and reused: a marker file records the arguments used.
"""

from __future__ import annotations

import resource

import io
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _fallback_real_photos(dest: Path, n: int, *, seed: int = 0, min_side: int = 200, max_side: int = 640):
    import numpy as np
    import skimage.data
    from PIL import Image

    srcs = []
    for name in ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "retina", "camera"):
        arr = np.asarray(getattr(skimage.data, name)())
        if arr.ndim == 2:
            arr = np.stack([arr] * 3, axis=-1)
        srcs.append(Image.fromarray(np.ascontiguousarray(arr[..., :3]).astype(np.uint8)))
    rng = np.random.default_rng(seed)
    dest.mkdir(parents=True, exist_ok=True)
    width = max(5, len(str(max(n - 1, 0))))
    paths, seen = [], set()
    for i in range(n):
        src = srcs[i % len(srcs)]
        while True:
            w, h = (int(x) for x in rng.integers(min_side, max_side + 1, size=2))
            frac = float(rng.uniform(0.3, 1.0))
            cw = min(src.width, src.height * w / h) * frac
            ch = cw * h / w
            x0, y0 = float(rng.uniform(0, src.width - cw)), float(rng.uniform(0, src.height - ch))
            img = src.resize((w, h), Image.Resampling.BICUBIC, box=(x0, y0, x0 + cw, y0 + ch))
            buf = io.BytesIO()
            img.save(buf, "JPEG", quality=92)
            data = buf.getvalue()
            if data not in seen:
                break
        seen.add(data)
        p = dest / f"photo_{i:0{width}d}.jpg"
        p.write_bytes(data)
        paths.append(p)
    return paths


def real_photos(dest: Path, n: int, *, seed: int = 0, min_side: int, max_side: int) -> list[Path]:
    """Generate (or reuse) ``n`` real JPEG photos in ``dest``; returns their sorted paths."""
    dest = Path(dest)
    marker = dest / ".bench-media.json"
    want = {"n": n, "seed": seed, "min_side": min_side, "max_side": max_side}
    if marker.is_file() and json.loads(marker.read_text()) == want:
        return sorted(dest.glob("photo_*.jpg"))
    if dest.exists():
        for p in dest.glob("photo_*.jpg"):
            p.unlink()
    t0 = time.perf_counter()
    try:
        sys.path.insert(0, str(REPO / "tests"))
        import media_factory  # type: ignore

        how = "tests/media_factory.real_photos"
        media_factory.real_photos(dest, n, seed=seed, min_side=min_side, max_side=max_side)
    except Exception as exc:  # noqa: BLE001 - module missing or being edited: use the local equivalent
        how = f"bench fallback ({type(exc).__name__}: {exc})"
        _fallback_real_photos(dest, n, seed=seed, min_side=min_side, max_side=max_side)
    finally:
        if str(REPO / "tests") in sys.path:
            sys.path.remove(str(REPO / "tests"))
    marker.write_text(json.dumps(want))
    print(f"# generated {n} photos ({min_side}..{max_side} px) in {dest} with {how} "
          f"in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return sorted(dest.glob("photo_*.jpg"))


def link_subset(src: list[Path], dest: Path) -> list[Path]:
    """Hard-link (copy if impossible) ``src`` files into ``dest`` (fresh)."""
    dest.mkdir(parents=True, exist_ok=True)
    want = {p.name for p in src}
    for p in dest.iterdir():
        if p.name not in want:
            p.unlink()
    out = []
    for p in src:
        q = dest / p.name
        if not q.exists():
            try:
                os.link(p, q)
            except OSError:
                q.write_bytes(p.read_bytes())
        out.append(q)
    return out


def package_fingerprint() -> dict:
    """Where ``shardsmith`` is imported from and a digest of its .py files (the code under test).

    Uses ``find_spec`` so nothing is imported (keeps the caller's RSS untouched).
    """
    import hashlib
    import importlib.util

    spec = importlib.util.find_spec("shardsmith")
    if spec is None or not spec.submodule_search_locations:
        return {"path": None, "sha256": None, "files": 0}
    root = Path(list(spec.submodule_search_locations)[0])
    h, n = hashlib.sha256(), 0
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
        n += 1
    return {"path": str(root), "sha256": h.hexdigest()[:16], "files": n}


def machine_info() -> dict:
    import platform
    import subprocess

    def sh(cmd: str) -> str:
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:  # noqa: BLE001
            return "?"

    mem_kb = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    return {"nproc": sh("nproc"), "cpu": sh("lscpu | grep 'Model name' | sed 's/.*: *//'"),
            "ram_gib": round(mem_kb / 2**20, 1), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "shardsmith": package_fingerprint()}


def write_pan_clip(path: Path, frames: int, h: int, w: int, i: int) -> None:
    """A real-content clip: a pan across an upscaled real photo, libx264 at 24 fps; clip ``i`` differs from every
    other (the build drops exact duplicates)."""
    import av
    import numpy as np
    from PIL import Image
    from skimage import data

    photo = [data.astronaut, data.chelsea, data.coffee, data.rocket][i % 4]()
    photo = np.roll(photo, 17 * i, axis=1)  # every clip distinct (the build drops exact duplicates)
    big = np.asarray(Image.fromarray(photo).resize((w * 2, h * 2), Image.Resampling.BICUBIC))
    with av.open(str(path), mode="w") as c:
        s = c.add_stream("libx264", rate=24)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for k in range(frames):
            x = int((big.shape[1] - w) * k / max(1, frames - 1))
            y = int((big.shape[0] - h) * k / max(1, frames - 1))
            fr = av.VideoFrame.from_ndarray(np.ascontiguousarray(big[y:y + h, x:x + w]), format="rgb24")
            for p in s.encode(fr):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def _pan_clip_job(args: tuple[Path, int, int, int, int]) -> None:
    path, frames, h, w, i = args
    write_pan_clip(path, frames, h, w, i)
    path.with_suffix(".txt").write_text(f"a slow pan across a photograph, clip {i}, {frames} frames")


def make_clips(dest: Path, n: int, h: int, w: int, procs: int) -> None:
    """``n`` distinct pan clips of 121-137 frames at ``h``x``w`` under ``dest``, each with a caption file."""
    from concurrent.futures import ProcessPoolExecutor

    dest.mkdir(parents=True, exist_ok=True)
    jobs = [(dest / f"clip_{i:04d}.mp4", 121 + i % 17, h, w, i) for i in range(n)]
    with ProcessPoolExecutor(procs) as ex:
        list(ex.map(_pan_clip_job, jobs))


# --------------------------------------------------------------------------- measurement
def cpu_now() -> float:
    """User+sys CPU seconds of this process and its joined (waited-for) children."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


_TCK = os.sysconf("SC_CLK_TCK")


def system_busy() -> float:
    """Busy CPU-seconds of the whole machine so far (all processes, all cores), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / _TCK


def wait_quiet(max_wait: float, busy_cores: float = 0.3, step: float = 0.5) -> float:
    """Wait (up to ``max_wait`` s) until other processes use < ``busy_cores`` cores; returns the wait."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_wait:
        b0, c0 = system_busy(), cpu_now()
        time.sleep(step)
        if (system_busy() - b0 - (cpu_now() - c0)) / step < busy_cores:
            break
    return time.perf_counter() - t0
