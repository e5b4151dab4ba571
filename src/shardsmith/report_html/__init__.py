"""``shardsmith report``: one self-contained HTML page about a finished build.

Contract
- In: a finished shardsmith build folder (its ``manifest.json``; its ledger, when there, must
  mark it complete), else :class:`ReportError` (a user error: exit 2); a path inside a build (one of
  its output folders, a ZIP) is refused naming the build folder to pass instead (``gather._refuse_inside_build``).
- An ``--output`` inside (or around) a source its manifest's recipe records is refused (exit 2),
  before anything is read or written.
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
from shardsmith.safety.outdir import recorded_sources, refuse_around_sources
from shardsmith.user_paths import check_no_loop, resolve_user_path

__all__ = ["REPORT_FILE", "ReportError", "render_report", "write_report"]


def render_report(build_dir: str | os.PathLike, *, previews: bool = True, device: str = "auto") -> str:
    """The HTML of the report of the finished build at ``build_dir``. ``previews=False``: latent
    outputs get no decoded previews (no VAE is loaded)."""
    from shardsmith.report_html.page import render
    from shardsmith.report_html.samples import collect, decode_previews, vae_status

    data = gather(resolve_user_path(build_dir))
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


def _dataset_folder(folder: Path) -> bool:
    """Whether ``folder`` holds a dataset's files (WebDataset shards, a shard count, a cache stamp)."""
    try:
        return any(p.suffix == ".tar" or p.name in ("shard_count.json", "shardsmith.json") for p in folder.iterdir())
    except OSError:
        return False


def check_output(root: Path, dest: Path) -> None:
    """Refuse (:class:`ReportError`) a ``--output`` that would overwrite or add to something that is
    not a report: ``dest`` may be the build's own ``report.html``, or a file anywhere else that does
    not exist yet or is a page this command wrote before (it starts with ``page.PAGE_HEAD``). Any
    other path inside a shardsmith build folder (its datasets, ``manifest.json``, ``.shardsmith/``)
    or inside a dataset folder is refused even when it does not exist; so is a folder that is not
    there (nothing is created) or cannot be written."""
    from shardsmith.formats.build_dir import STATE_DIR
    from shardsmith.report_html.page import PAGE_HEAD

    fix = f"pick a new file name outside the build, e.g. {root.name}-report.html, or leave --output out to write {root / REPORT_FILE}"
    if dest.is_dir():
        raise ReportError(f"--output {dest} is a folder; give a file name such as {dest / REPORT_FILE}")
    for folder in dest.parents:
        build = folder == root or (folder / STATE_DIR).is_dir()
        if build and dest != folder / REPORT_FILE:
            raise ReportError(f"--output {dest} lies inside the shardsmith build {folder}: the report writes "
                              f"nothing there but {folder / REPORT_FILE}; {fix}")
    if _dataset_folder(dest.parent):
        raise ReportError(f"--output {dest} lies inside the dataset folder {dest.parent}; {fix}")
    if dest == root / REPORT_FILE:
        return  # the build's own page: the build writes it there too
    if dest.exists() or dest.is_symlink():
        if not dest.is_file():
            raise ReportError(f"--output {dest} exists and is not a regular file; {fix}")
        try:
            with open(dest, "rb") as f:
                ours = f.read(len(PAGE_HEAD.encode())) == PAGE_HEAD.encode()
        except OSError as exc:
            raise ReportError(f"--output {dest} exists and cannot be read ({exc.strerror}); {fix}") from None
        if not ours:
            raise ReportError(f"--output {dest} exists and is not a shardsmith report (report never overwrites "
                              "another file): pick a new file name, or delete that file yourself first")
    if not dest.parent.is_dir():
        raise ReportError(f"--output {dest}: the folder {dest.parent} does not exist (it is not created); "
                          "create it first or pick another --output")
    if not os.access(dest.parent, os.W_OK | os.X_OK):
        raise ReportError(f"--output {dest}: the folder {dest.parent} cannot be written; pick another --output")


def _output_path(output: str | os.PathLike) -> Path:
    """``--output`` made absolute through the symlinks of its folder, its own name kept: a symlink there is
    replaced by the page (``atomic_write_bytes`` renames onto the link, as ``verify --out-json`` does), never
    written through, so a link into another build cannot overwrite that build's ``report.html``; the checks
    look at where the page will really be."""
    check_no_loop(output, "--output")  # (a link that leads back to itself: one message naming it)
    given = Path(os.path.expanduser(os.fspath(output)))
    if given.name in ("", ".", ".."):
        return resolve_user_path(given, "--output")
    return resolve_user_path(given.parent, "--output") / given.name


def write_report(build_dir: str | os.PathLike, output: str | os.PathLike | None = None, *, previews: bool = True,
                 device: str = "auto") -> Path:
    """Write the report of the build at ``build_dir`` to ``output`` (default
    ``<build_dir>/report.html``) atomically; the file written (an ``output`` that is a symlink is replaced
    by the page, its target left alone: :func:`_output_path`). An ``output`` that :func:`check_output`
    refuses is a :class:`ReportError`, raised before anything is read or written."""
    from shardsmith.atomic import atomic_write_bytes
    from shardsmith.report_html.gather import read_manifest

    root = resolve_user_path(build_dir)
    dest = _output_path(output) if output is not None else root / REPORT_FILE
    manifest = read_manifest(root)  # a folder that is no finished build is said first
    # a page among the sources would be read by the next build
    refuse_around_sources(dest, recorded_sources(manifest), "--output",
                          "report never writes into or around the sources this build read")
    check_output(root, dest)
    html = render_report(root, previews=previews, device=device)
    try:
        atomic_write_bytes(dest, html.encode("utf-8"))
    except OSError as exc:
        raise ReportError(f"cannot write the report to {dest}: {exc.strerror or exc}; pick another --output "
                          "(or free space there)") from None
    return dest
