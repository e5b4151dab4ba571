"""Which shardsmith build wrote a dataset, whether that build is finished, and the count its
manifest records.

- :func:`find_build`: the :class:`BuildRef` of the nearest build folder at or above a dataset
  (``formats.detect.enclosing_build``) whose recorded recipe (or manifest) has an output at the
  dataset, else None.
- :func:`unfinished`: the message ``verify`` fails with for a build that is not finished, or None.
- :func:`manifest_count`: the ``written`` count the enclosing build's manifest records for the
  dataset, and where it was read, or ``(None, None)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from shardsmith.formats.build_dir import HOLDOUT_DIR, LEDGER_FILE, MANIFEST_FILE
from shardsmith.formats.detect import enclosing_build


def _manifest_entry(mpath: Path, rel: str) -> tuple[str, str, int] | None:
    """(output, split, written) of the output the manifest at ``mpath`` writes to ``rel``
    (relative to the manifest's folder), or None."""
    try:
        m = json.loads(mpath.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    for name, out in m.get("outputs", {}).items():
        for split, info in out.get("files", {}).items():
            if rel in (info.get("dir"), info.get("path")):
                return name, split, out["splits"][split]["written"]
    return None


def manifest_count(dataset: Path) -> tuple[int | None, str | None]:
    """Written count recorded by the shardsmith build that produced ``dataset``, if any: the
    manifest of the nearest build folder above ``dataset``."""
    found = enclosing_build(dataset.resolve().parent)
    if found is None or not found.has_manifest:
        return None, None
    mpath = found.root / MANIFEST_FILE
    entry = _manifest_entry(mpath, dataset.resolve().relative_to(found.root).as_posix())
    if entry is None:
        return None, None
    name, split, written = entry
    return written, f"{mpath} output {name} split {split}"


@dataclass(frozen=True)
class BuildRef:
    """The shardsmith build folder that wrote a dataset, and which output and split the dataset is.
    ``complete``: a manifest is there and the ledger (when there is one) marks the build complete."""

    root: Path
    output: str
    split: str
    has_ledger: bool
    has_manifest: bool
    complete: bool


def _ledger_entry(root: Path, rel: str) -> tuple[str, str] | None:
    """(output, split) of the output the ledger's recorded recipe writes to ``rel``, or None."""
    from shardsmith.safety.outdir import recorded_layout
    from shardsmith.split.assign import HOLDOUT, TRAIN

    for lay in recorded_layout(root)[0]:
        target = PurePosixPath(lay.target).as_posix()
        if rel == target:
            return lay.name, TRAIN
        if rel == f"{HOLDOUT_DIR}/{target}":
            return lay.name, HOLDOUT
    return None


def find_build(dataset: str | Path) -> BuildRef | None:
    """The build that wrote ``dataset``: the nearest folder at or above it holding a ledger or a
    manifest, when that build's recorded recipe (or manifest) has an output at ``dataset``."""
    from shardsmith.plan.ledger import Ledger

    found = enclosing_build(dataset)
    if found is None:
        return None
    root, has_ledger, has_manifest = found
    rel = Path(dataset).resolve().relative_to(root).as_posix()
    if has_ledger:
        entry = _ledger_entry(root, rel)
    else:
        written = _manifest_entry(root / MANIFEST_FILE, rel)
        entry = written[:2] if written else None
    if entry is None:
        return None
    done = has_manifest and (not has_ledger or bool(Ledger.peek(root / LEDGER_FILE, "complete")[0]))
    return BuildRef(root, entry[0], entry[1], has_ledger, has_manifest, done)


def unfinished(build: BuildRef) -> str | None:
    """Why ``build`` is not finished (the message verify fails with), or None when it is."""
    from shardsmith.safety.lock import holder

    if build.complete:
        return None
    why = (f"{build.root} has a ledger ({LEDGER_FILE}) but no {MANIFEST_FILE}"
           if not build.has_manifest else f"its ledger {build.root / LEDGER_FILE} does not mark it complete")
    running = holder(build.root)
    now = f"; a build is running on it now ({running})" if running else ""
    return f"build not finished: resume it with the same command ({why}{now})"
