"""What the report shows, read from a finished build folder: its manifest, a bounded sample of
its ledger's items (sizes, aspect, video facts from item meta) and its last verify reports.

Memory and time stay bounded whatever the build's size: items are sampled in SQL (every k-th
``idx``, at most :data:`MAX_SAMPLED` rows), never all read.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardsmith.atomic import read_json
from shardsmith.errors import UserError
from shardsmith.formats.build_dir import LEDGER_FILE, MANIFEST_FILE
from shardsmith.formats.detect import enclosing_build, is_build
from shardsmith.user_paths import user_path_exists

MAX_SAMPLED = 20000  # item rows read for the histograms, at most
VIDEO_META = ("frames", "fps", "duration")  # item meta keys plotted when present


class ReportError(UserError):
    """``shardsmith report`` on a folder that is not a finished shardsmith build."""


@dataclass
class ItemStats:
    """Histogram inputs from the ledger: a sample of the usable items."""

    total: int = 0  # usable (plan ok) items
    sampled: int = 0  # of them, read
    kinds: dict[str, int] = field(default_factory=dict)  # usable items by kind (all, in SQL)
    widths: list[int] = field(default_factory=list)
    heights: list[int] = field(default_factory=list)
    aspects: list[float] = field(default_factory=list)
    video: dict[str, list[float]] = field(default_factory=dict)  # frames / fps / duration from item meta


@dataclass
class BuildData:
    root: Path
    manifest: dict[str, Any]
    stats: ItemStats | None  # None without a ledger
    verify: list[dict[str, Any]]  # verify/record.py documents, newest first
    notes: list[str] = field(default_factory=list)
    preview: dict[str, Any] | None = None  # distill.preview's preview.json, each picture with its PNG bytes


def read_preview(root: Path, limit: int = 16) -> dict[str, Any] | None:
    """``distill.preview``'s ``preview.json`` with each picture's bytes (``png``; at most ``limit``),
    or None when the build wrote none (or it cannot be read: the page says nothing then)."""
    from shardsmith.distill.preview import PREVIEW_DIR, PREVIEW_FILE

    folder = root / PREVIEW_DIR
    try:
        info = json.loads((folder / PREVIEW_FILE).read_text(encoding="utf-8"))
        for pic in info.get("pictures", [])[:limit]:
            pic["png"] = (folder / Path(pic["file"]).name).read_bytes()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    info["pictures"] = [p for p in info.get("pictures", [])[:limit] if "png" in p]
    return info


def _refuse_inside_build(path: Path) -> None:
    """Refuse (:class:`ReportError`) ``path`` when it lies inside a build (one of its output folders, a ZIP, a
    shard, at any depth: ``holdout/deep/er/wds``), naming that build folder to pass instead."""
    found = enclosing_build(path.parent)
    if found is None:
        return
    above = found.root
    if path.is_dir() and path.resolve().parent == above:
        what = f"an output folder of the shardsmith build at {above}"
    else:
        what = f"a {'folder' if path.is_dir() else 'file'} inside the shardsmith build at {above}"
    if found.has_manifest:
        raise ReportError(f"{path} is {what}, not a build; the report is of the whole build: pass {above} "
                          f"instead (shardsmith report {above})")
    raise ReportError(f"{path} is {what}, not a build, and that build is not finished ({LEDGER_FILE} but no "
                      f"{MANIFEST_FILE}): resume it with the same command, then pass {above} (shardsmith report "
                      f"{above})")


def read_manifest(root: Path) -> dict[str, Any]:
    """The manifest of the finished build at ``root``, or :class:`ReportError` saying what it is (a path this
    user may not read: a :class:`~shardsmith.user_paths.PathPermissionError`)."""
    user_path_exists(root)
    if root.is_file():
        _refuse_inside_build(root)
    if not root.is_dir():
        raise ReportError(f"{root} {'is a file' if root.exists() else 'does not exist'}; shardsmith report takes "
                          "the --out folder of a finished shardsmith build")
    mpath = root / MANIFEST_FILE
    ledger = root / LEDGER_FILE
    if not mpath.is_file():
        if is_build(root):
            raise ReportError(f"{root}: build not finished ({LEDGER_FILE} but no {MANIFEST_FILE}): resume it with "
                              "the same command, then run shardsmith report")
        _refuse_inside_build(root)
        raise ReportError(f"{root} is not a shardsmith build (no {MANIFEST_FILE}); shardsmith report takes the "
                          "--out folder of a finished shardsmith build")
    try:
        manifest = read_json(mpath)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ReportError(f"{mpath} cannot be read as a shardsmith manifest: {exc}; restore it from a copy, or "
                          "rebuild into a new --out") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("outputs"), dict) or "counts" not in manifest:
        raise ReportError(f"{mpath} is not a shardsmith manifest (no counts and outputs)")
    if is_build(root):  # (a ledger this user may not look at: another user's build, read from its manifest)
        from shardsmith.plan.ledger import Ledger

        try:
            complete = Ledger.peek(ledger, "complete")[0]
        except (sqlite3.DatabaseError, ValueError, OSError) as exc:
            from shardsmith.verify.owning_build import no_room_to_read

            if (full := no_room_to_read(ledger, exc)) is not None:
                raise ReportError(full) from None
            if isinstance(exc, OSError):
                raise
            raise ReportError(f"{ledger} cannot be read ({exc}): the ledger is damaged; rebuild into a new --out "
                              "(shardsmith verify still checks the datasets themselves)") from None
        if not complete:
            raise ReportError(f"{root}: build not finished (its ledger does not mark it complete): resume it with "
                              "the same command, then run shardsmith report")
    return manifest


def item_stats(ledger_path: Path, max_sampled: int = MAX_SAMPLED) -> ItemStats:
    """Sizes and video facts of at most ``max_sampled`` usable items, every k-th by plan order."""
    from shardsmith.plan.ledger import Ledger

    # read only: the report writes nothing in the build (a read-only build, a damaged ledger: no histograms)
    try:
        led = Ledger._immutable(ledger_path)
        led.db.execute("SELECT 1 FROM items LIMIT 1").fetchall()
    except sqlite3.DatabaseError:
        return ItemStats()
    try:
        db = led.db
        st = ItemStats()
        st.kinds = dict(db.execute("SELECT kind, COUNT(*) FROM items WHERE plan_status='ok' GROUP BY kind "
                                   "ORDER BY kind").fetchall())
        st.total = sum(st.kinds.values())
        step = max(1, -(-st.total // max_sampled))
        rows = db.execute("SELECT kind, width, height, meta FROM items WHERE plan_status='ok' AND idx % ? = 0 "
                          "ORDER BY idx LIMIT ?", (step, max_sampled))
        for kind, w, h, meta in rows:
            st.sampled += 1
            if w and h:
                st.widths.append(w)
                st.heights.append(h)
                st.aspects.append(round(w / h, 4))
            if kind != "video" or not meta or meta == "{}":
                continue
            try:
                m = json.loads(meta)
            except ValueError:
                continue
            for key in VIDEO_META:
                v = m.get(key) if isinstance(m, dict) else None
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    st.video.setdefault(key, []).append(float(v))
        return st
    finally:
        led.close()


def gather(root: Path) -> BuildData:
    from shardsmith.verify.record import latest

    manifest = read_manifest(root)
    ledger = root / LEDGER_FILE
    stats = item_stats(ledger) if is_build(root) else None
    found = enclosing_build(root)
    closed = found is not None and found.root == Path(root).resolve() and found.ledger_unreadable
    try:
        verified = latest(root)
    except PermissionError:  # (another user's build whose state folder is closed to this user)
        verified, closed = [], True
    data = BuildData(root, manifest, stats, verified, preview=read_preview(root))
    if closed:
        data.notes.append("the build's state folder cannot be read by this user: no size histograms, no verify "
                          "records")
    elif stats is None:
        data.notes.append(f"no ledger ({LEDGER_FILE}): no size histograms")
    return data
