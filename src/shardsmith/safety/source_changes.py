"""What changed in a build's sources since its plan, so that a re-run never says "nothing to do" of a
dataset that no longer matches them without saying so.

Contract
- ``source_changes(ledger_path, opened, since)``: the sources listed again (``opened``, as
  :func:`~shardsmith.sources.base.open_sources` gives them) against the ledger's planned items:
  ``added`` (listed now, not planned), ``gone`` (planned, no longer listed, or their file is missing),
  ``changed`` (a planned file of another size now, or modified after ``since`` (a POSIX time, the build's
  start) with other bytes than the plan hashed, or whose caption is not the planned one: a sidecar ``.txt``
  edited, a table's caption cell, a prompt dataset's ``txt``; compared as the plan stored it, with the recipe's
  ``lora_trigger`` in front, or a prompt dataset's sample whose ``txt_emb.pth`` / ``latent.pth`` is no longer where the
  plan read it or not the bytes it listed there: the dataset rebuilt, its samples moved within or between shards,
  :func:`~shardsmith.sources.wds.member_refs`; a resumed distill fails those as ``changed_since_plan``). Only files
  changed after ``since`` are hashed again.
- ``files``: the build's other inputs that changed: a ``shardsmith distill`` source's ``neg_prompt_emb.npy``
  whose bytes are not the sha256 the ledger recorded when the distill began
  (:func:`shardsmith.distill.sources.settle_negative`).
- ``collect=True``: ``caption_changed`` holds the id of every item whose caption changed (not only the first
  few), for a resume that fails them as ``changed_since_plan`` (``shardsmith distill``).
- An item listed under another id than the plan's, for the same file (a table path spelled otherwise by an
  older shardsmith: ``t/./a/x.png`` planned, ``t/a/x.png`` now), is the planned item, not one gone and one new.
- The ledger is read only (``mode=ro``); the listing's item ids go through a temporary on-disk table,
  so memory does not grow with the dataset.
- ``SourceChanges.summary()``: one line, counts and the first few item ids of each kind.
"""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

EXAMPLES = 3


@dataclass
class SourceChanges:
    added: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"added": 0, "gone": 0, "changed": 0})
    files: list[str] = field(default_factory=list)  # other inputs changed (a distill source's neg_prompt_emb.npy)
    caption_changed: set[str] | None = None  # every item whose caption changed, with collect=True

    def __bool__(self) -> bool:
        return any(self.counts.values()) or bool(self.files)

    def summary(self) -> str:
        parts = []
        for kind, label in (("added", "new"), ("changed", "changed"), ("gone", "gone")):
            n = self.counts[kind]
            if n:
                shown = getattr(self, kind)
                more = f", +{n - len(shown)} more" if n > len(shown) else ""
                parts.append(f"{n} {label} ({', '.join(shown)}{more})")
        parts += [f"{f} changed" for f in self.files]
        return ", ".join(parts)


def _note(ch: SourceChanges, kind: str, item_id: str) -> None:
    ch.counts[kind] += 1
    if len(getattr(ch, kind)) < EXAMPLES:
        getattr(ch, kind).append(item_id)


def _sha256(path: str) -> str | None:
    """The plan's own hash of ``path`` (:func:`~shardsmith.plan.probe.read_and_hash`), None where it cannot be read."""
    from shardsmith.plan.probe import read_and_hash

    try:
        return read_and_hash(path, keep=False)[1]
    except OSError:
        return None


def _file_changed(ref: dict, since: float) -> str | None:
    """``"gone"``, ``"changed"`` or None for one planned file (its ledger ``media`` entry)."""
    try:
        st = os.stat(ref["path"])
    except FileNotFoundError:
        return "gone"
    except OSError:
        return None  # unreadable now: the build's own read would say why; not a change we can tell
    if ref.get("size_bytes") is not None and st.st_size != ref["size_bytes"]:
        return "changed"
    if st.st_mtime > since and _sha256(ref["path"]) != ref["sha256"]:
        return "changed"
    return None


def _same_files_respelled(db: sqlite3.Connection) -> None:
    """Give a listed item the planned id of the same file where only the id's spelling differs: a table row
    ``./a/x.png`` planned as ``t/./a/x.png`` before table paths were spelled once (``t/a/x.png`` now), or a
    repeated row that is now ``#row<n>``. Matched by the file's path (normalised), in plan order, among the ids
    found on one side only; an unchanged build has none, so this costs nothing there."""
    planned: dict[str, list[str]] = {}
    for item_id, media in db.execute("SELECT item_id, media FROM l.items WHERE item_id NOT IN (SELECT item_id FROM "
                                     "now) ORDER BY idx"):
        path = json.loads(media or "{}").get("target", {}).get("path")
        if path:
            planned.setdefault(os.path.normpath(path), []).append(item_id)
    if not planned:
        return
    renamed = []
    for item_id, path in db.execute("SELECT item_id, path FROM now WHERE item_id NOT IN (SELECT item_id FROM "
                                    "l.items) ORDER BY item_id").fetchall():
        ids = planned.get(os.path.normpath(path)) if path else None
        if ids:
            renamed.append((ids.pop(0), item_id))
    db.executemany("UPDATE now SET item_id = ? WHERE item_id = ?", renamed)


def _wds_json(meta: dict | None) -> str | None:
    from shardsmith.sources.wds import member_refs

    refs = member_refs((meta or {}).get("wds"))
    return json.dumps(refs, sort_keys=True) if refs else None


def _wds_moved(planned_meta: str | None, now: str) -> bool:
    """Whether a WebDataset sample's members a distill reads are no longer at the planned positions, or (where the
    plan listed their sha256) not the planned bytes."""
    from shardsmith.sources.wds import KEPT_MEMBERS, SHA256, member_refs

    try:
        planned = member_refs(json.loads(planned_meta or "{}").get("wds"))
    except (ValueError, AttributeError):
        return False
    if not planned:
        return False
    now_refs = json.loads(now)
    if any(planned.get(m) != now_refs.get(m) for m in KEPT_MEMBERS):
        return True
    shas, now_shas = planned.get(SHA256) or {}, now_refs.get(SHA256) or {}  # (none listed: a shard not modified
    return any(m in now_shas and now_shas[m] != h for m, h in shas.items())  # since the plan, not hashed again)


def _meta(db: sqlite3.Connection, key: str):
    row = db.execute("SELECT value FROM l.meta WHERE key=?", (key,)).fetchone()
    return json.loads(row[0]) if row else None


def _negative_changed(db: sqlite3.Connection) -> str | None:
    """The path of a distill source's ``neg_prompt_emb.npy`` whose bytes are not those the ledger recorded."""
    from shardsmith.distill.sources import NEGATIVE_KEY

    rec = _meta(db, NEGATIVE_KEY)
    if not isinstance(rec, dict) or rec.get("origin") != "source" or not rec.get("file"):
        return None
    return rec["file"] if _sha256(rec["file"]) != rec.get("sha256") else None


def source_changes(ledger_path: Path, opened: list[tuple[object, Callable[[], Iterator]]],
                   since: float, *, collect: bool = False) -> SourceChanges:
    from shardsmith.plan.planner import with_trigger

    ch = SourceChanges(caption_changed=set() if collect else None)
    db = sqlite3.connect("file:?mode=rwc", uri=True)  # a private temporary database on disk
    try:
        db.execute("ATTACH DATABASE ? AS l", (f"{Path(ledger_path).resolve().as_uri()}?mode=ro",))
        trigger = (_meta(db, "recipe") or {}).get("lora_trigger")  # the plan stored captions with it in front
        db.execute("CREATE TABLE now (item_id TEXT PRIMARY KEY, caption TEXT, path TEXT, wds TEXT)")
        for _, items in opened:
            owner = getattr(items, "__self__", None)
            if hasattr(owner, "hash_after"):  # a prompt dataset: hash only the shards modified since the plan began
                owner.hash_after = since
            stream = iter(items())
            while batch := list(itertools.islice(stream, 1000)):
                db.executemany("INSERT OR IGNORE INTO now VALUES (?, ?, ?, ?)",
                               [(it.item_id, with_trigger(it.caption, trigger), it.path, _wds_json(it.meta))
                                for it in batch])
        _same_files_respelled(db)
        for (item_id,) in db.execute("SELECT item_id FROM now WHERE item_id NOT IN (SELECT item_id FROM l.items) "
                                     "ORDER BY item_id"):
            _note(ch, "added", item_id)
        for item_id, in_now, media, caption_changed, meta, wds_now in db.execute(
                "SELECT i.item_id, n.item_id IS NOT NULL, i.media, n.caption IS NOT i.caption, i.meta, n.wds "
                "FROM l.items i LEFT JOIN now n ON n.item_id = i.item_id ORDER BY i.idx"):
            if not in_now:
                _note(ch, "gone", item_id)
                continue
            if caption_changed:  # a sidecar .txt, a table's caption cell, a prompt dataset's txt edited
                _note(ch, "changed", item_id)
                if ch.caption_changed is not None:
                    ch.caption_changed.add(item_id)
                continue
            if wds_now is not None and _wds_moved(meta, wds_now):  # a prompt dataset rebuilt under the same keys
                _note(ch, "changed", item_id)
                continue
            for ref in json.loads(media or "{}").values():
                if ref.get("sha256") is None:
                    continue  # not read at plan time (failed there): nothing to compare
                kind = _file_changed(ref, since)
                if kind is not None:
                    _note(ch, kind, item_id)
                    break
        negative = _negative_changed(db)
        if negative is not None:
            ch.files.append(negative)
    finally:
        db.close()
    return ch
