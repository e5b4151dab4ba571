"""``shardsmith report``: one self-contained HTML page about a finished build.

Contract
- In: a finished shardsmith build folder (its ``manifest.json``; its ledger, when there, must
  mark it complete), else :class:`ReportError` (a user error: exit 2).
- Out: ``<build>/report.html`` (``formats.build_dir.REPORT_FILE``) or the given file, written
  atomically: counts per output and split with every skip / failure reason and up to 5 example
  ids and the detail; the per-bucket table of latent outputs; sources and models (a random-weight
  VAE labelled "random-weights: previews are meaningless"); a contact sheet per output, split and
  bucket (``samples.py``: thumbnails of what was written, decoded previews of latents); histograms
  of image sizes, aspect, video frames / fps / duration and buckets (``gather.py``: the ledger
  sampled in SQL; inline SVG, ``svg.py``); the last verify of each of its datasets
  (``verify/record.py``).
- The page (``page.py``) needs nothing but itself: CSS inline, images as ``data:`` URIs, no
  script, a Content-Security-Policy forbidding every fetch. Every string from the build or its
  sources is HTML-escaped.
- Bounded time and memory whatever the build's size (capped reads, SQL sampling). A part that
  cannot be drawn (a damaged shard, a VAE that cannot be rebuilt) is said in the page, never a
  failure of the report.
"""

from __future__ import annotations

import os
from pathlib import Path

from shardsmith.formats.build_dir import REPORT_FILE
from shardsmith.report_html.gather import ReportError, gather

__all__ = ["REPORT_FILE", "ReportError", "render_report", "write_report"]


def render_report(build_dir: str | os.PathLike, *, previews: bool = True, device: str = "auto") -> str:
    """The HTML of the report of the finished build at ``build_dir``. ``previews=False``: latent
    outputs get no decoded previews (no VAE is loaded)."""
    from shardsmith.report_html.page import render
    from shardsmith.report_html.samples import collect, decode_previews, vae_status

    data = gather(Path(build_dir).resolve())
    facts: dict = {}
    sheets = collect(data.root, data.manifest, facts)
    _, random = vae_status(data.manifest)
    notes = []
    if previews:
        note = decode_previews(data.manifest, sheets, device=device)
        if note:
            notes.append(note)
    else:
        for s in sheets:
            if s.pending:
                s.notes.append("latent previews not drawn (previews=False)")
                s.pending.clear()
    return render(data, sheets, facts, random, notes)


def write_report(build_dir: str | os.PathLike, output: str | os.PathLike | None = None, *, previews: bool = True,
                 device: str = "auto") -> Path:
    """Write the report of the build at ``build_dir`` to ``output`` (default
    ``<build_dir>/report.html``) atomically; the file written."""
    from shardsmith.atomic import atomic_write_bytes

    root = Path(build_dir).resolve()
    dest = Path(output).resolve() if output is not None else root / REPORT_FILE
    if dest.is_dir():
        raise ReportError(f"--output {dest} is a folder; give a file name such as {dest / REPORT_FILE}")
    html = render_report(root, previews=previews, device=device)
    atomic_write_bytes(dest, html.encode("utf-8"))
    return dest
