"""``shardsmith build`` as a user runs it, timed from the command to the manifest, for the benchmarks.

Contract
- ``timed_build(argv, out, env=None, src=None)``: runs ``python -m shardsmith build *argv --out out`` in a
  subprocess, with ``src`` (default: this checkout's ``src``) first on its path (``out`` removed first), and
  returns a :class:`CliRun`: the exit code, the seconds from
  the command to the manifest's mtime (the manifest is the last file a build writes before its HTML
  report), the seconds to the process's exit, the manifest (None when the build failed) and the tail
  of its stderr.
- ``subset_build(recipe, src, work, n, argv)``: an untimed build of the first ``n`` media files of ``src``
  (hard links, captions beside them) with ``recipe``'s settings; seconds taken. It puts the libraries' files
  in the page cache and, with ``models.compile: on``, fills the persistent compile cache, as a user's
  earlier build on that machine would.
- ``output_digests(root)``: sha256 of every file under ``root`` that is output, by relative path (the
  ``.shardsmith/`` state, the manifest and the report left out): what "the same bytes" compares.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass
class CliRun:
    rc: int
    wall_s: float | None  # command to manifest
    exit_s: float  # command to process exit
    manifest: dict | None
    stderr_tail: str


def timed_build(argv: list[str], out: Path, env: dict[str, str] | None = None, src: Path | None = None) -> CliRun:
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src or REPO / "src"), env.get("PYTHONPATH", "")) if p)
    t, t_wall = time.perf_counter(), time.time()
    r = subprocess.run([sys.executable, "-m", "shardsmith", "build", *argv, "--out", str(out)],
                       capture_output=True, text=True, env=env)
    exit_s = time.perf_counter() - t
    mf = out / "manifest.json"
    if r.returncode != 0 or not mf.is_file():
        return CliRun(r.returncode, None, exit_s, None, r.stderr[-3000:])
    return CliRun(0, mf.stat().st_mtime - t_wall, exit_s, json.loads(mf.read_text()), r.stderr[-3000:])


def output_digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".shardsmith" not in p.relative_to(root).parts
            and p.name not in ("manifest.json", "report.html")}


def subset_build(recipe: dict, src: Path, work: Path, n: int, argv: list[str] | tuple[str, ...] = ()) -> float:
    sub = work / "warm_src"
    shutil.rmtree(sub, ignore_errors=True)
    sub.mkdir(parents=True)
    for i, f in enumerate(sorted(p for p in src.rglob("*") if p.is_file() and p.suffix != ".txt")[:n]):
        os.link(f, sub / f"{i:05d}{f.suffix}")
        if f.with_suffix(".txt").is_file():
            os.link(f.with_suffix(".txt"), sub / f"{i:05d}.txt")
    rp = work / "warm.json"
    rp.write_text(json.dumps({**recipe, "sources": [{"path": str(sub)}]}))
    t = time.perf_counter()
    r = timed_build([str(rp), *argv, "--no-report", "-q"], work / "out_warm")
    if r.rc:
        raise SystemExit(f"the warm-up build failed:\n{r.stderr_tail}")
    return time.perf_counter() - t
