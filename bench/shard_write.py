"""Benchmark: writing one WebDataset shard (``WdsSink.write_unit``: tar + sha256 + fsync) against
the writer before 2026-12-03's sixth session (``tarfile.addfile`` copying each member through
16 KiB reads of a ``BytesIO``, sha256 updated inline on the same thread), same members, same
atomic write (temporary file, fsync, rename), variants interleaved (ABBA), ratio per pair.

Workloads (sizes of this project's H200 runs):
- ``text``: 63 samples of a T5-XXL ``txt_emb.pth`` (4 MiB: 512 x 4096 bf16) + small json, one
  256 MiB shard (``--text-shard-mib 256`` in bench/gpu_encode.py);
- ``latent``: 1000 samples of a 4x32x32 float32 ``latent.pth`` (16 KiB) + small json.

Then ``threads``: 6 text shards written by ``WdsSink.write_unit`` on 1 thread and on 2 (the latent
finisher's ``WRITER_THREADS``), ABBA, ratio per pair.

    /work/venv/bin/python bench/shard_write.py --repeats 5 [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import statistics
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from shardsmith import formats  # noqa: E402
from shardsmith.records import SampleResult  # noqa: E402
from shardsmith.recipe import WdsOutput  # noqa: E402
from shardsmith.atomic import atomic_open  # noqa: E402
from shardsmith.sinks.tar import FIXED_MTIME  # noqa: E402
from shardsmith.sinks.wds import WdsSink  # noqa: E402


def before(dest: Path, seq: int, samples) -> tuple[str, int, str]:
    """The write path as it was (sinks/tar.py at d41fe47)."""
    name = formats.shard_name(seq)
    with atomic_open(dest / name) as f:
        sha, size = hashlib.sha256(), 0

        class Hashing:
            def write(self, data):
                nonlocal size
                sha.update(data)
                size += len(data)
                return f.write(data)

            def tell(self):
                return size

        tar = tarfile.open(fileobj=Hashing(), mode="w", format=tarfile.PAX_FORMAT)
        for key, s in samples:
            for suffix, data in s.members.items():
                info = tarfile.TarInfo(formats.member_name(key, suffix))
                info.size, info.mtime, info.mode = len(data), FIXED_MTIME, 0o444
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))
        tar.close()
    return name, size, sha.hexdigest()


def workload(kind: str):
    meta = json.dumps({"id": "x" * 16, "source": "photos", "path": "a/b.jpg"}).encode()
    n, size = (63, 4 << 20) if kind == "text" else (1000, 16 << 10)
    suffix = "txt_emb.pth" if kind == "text" else "latent.pth"
    return [(f"{i:08d}", SampleResult(i, "written", members={suffix: os.urandom(size), "json": meta}))
            for i in range(n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    out = {"machine": {"nproc": os.cpu_count(), "python": sys.version.split()[0]}, "workloads": {}}
    for kind in ("text", "latent"):
        samples = workload(kind)
        with tempfile.TemporaryDirectory(dir="/tmp") as d:
            dest = Path(d)
            sink = WdsSink(WdsOutput(format="wds"), dest)
            fns = {"before": lambda: before(dest, 0, samples), "now": lambda: sink.write_unit(1, samples)}
            a, b = fns["before"](), fns["now"]()  # warm-up; the same bytes and hash
            assert (dest / a[0]).read_bytes() == (dest / b[0]).read_bytes() and a[1:] == b[1:], "outputs differ"
            times = {k: [] for k in fns}
            for r in range(args.repeats):
                for k in (("before", "now") if r % 2 == 0 else ("now", "before")):
                    t = time.perf_counter()
                    fns[k]()
                    times[k].append(time.perf_counter() - t)
        ratios = [n / b for n, b in zip(times["now"], times["before"])]
        mb = a[1] / 1e6
        row = {"shard_mb": round(mb, 1), "before_s": statistics.median(times["before"]),
               "now_s": statistics.median(times["now"]), "ratio_now_over_before": statistics.median(ratios),
               "ratio_min": min(ratios), "ratio_max": max(ratios), "times": times}
        out["workloads"][kind] = row
        print(f"{kind:<7} shard {mb:7.1f} MB  before {row['before_s']:.3f} s ({mb / row['before_s']:.0f} MB/s)  "
              f"now {row['now_s']:.3f} s ({mb / row['now_s']:.0f} MB/s)  now/before {row['ratio_now_over_before']:.3f} "
              f"({min(ratios):.3f}..{max(ratios):.3f})", flush=True)
    samples = workload("text")

    def shards_on(threads: int, n: int = 6) -> float:
        with tempfile.TemporaryDirectory(dir="/tmp") as d:
            sink = WdsSink(WdsOutput(format="wds"), Path(d))
            t = time.perf_counter()
            with ThreadPoolExecutor(threads) as ex:
                list(ex.map(lambda i: sink.write_unit(i, samples), range(n)))
            return time.perf_counter() - t

    times = {1: [], 2: []}
    for r in range(args.repeats):
        for k in ((1, 2) if r % 2 == 0 else (2, 1)):
            times[k].append(shards_on(k))
    ratios = [b / a for a, b in zip(times[1], times[2])]
    out["threads"] = {"shards": 6, "one_thread_s": statistics.median(times[1]), "two_threads_s": statistics.median(times[2]),
                      "ratio_two_over_one": statistics.median(ratios), "ratio_min": min(ratios),
                      "ratio_max": max(ratios), "times": times}
    print(f"threads 6 text shards  1 thread {statistics.median(times[1]):.2f} s  2 threads "
          f"{statistics.median(times[2]):.2f} s  2/1 {statistics.median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f})")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
