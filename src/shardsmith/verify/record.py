"""The last ``verify`` report of each dataset of a shardsmith build, kept in the build folder.

Contract
- :func:`record`: after a verify of a dataset that a finished shardsmith build wrote
  (``owning_build.find_build``), its report is written atomically to
  ``<build>/.shardsmith/verify/<dataset path, / as __>.json`` (``formats.build_dir.VERIFY_DIR``)
  with ``verified_at`` (UTC), the dataset's path relative to the build, its output and split.
  A dataset no build wrote, or whose build is unfinished, records nothing (returns None). A write
  that fails (read-only folder) is not the verify's failure: None.
- :func:`latest`: every recorded report of a build folder, newest first.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from shardsmith.atomic import read_json
from shardsmith.formats.build_dir import VERIFY_DIR, verify_record_name


def record(dataset: str | Path, report: dict[str, Any]) -> Path | None:
    """Keep ``report`` as the last verify of ``dataset`` in its build folder; the file, or None."""
    from shardsmith.atomic import atomic_write_json
    from shardsmith.verify.owning_build import find_build

    dataset = Path(dataset).resolve()
    from shardsmith.errors import UserError

    try:
        build = find_build(dataset)
    except (OSError, ValueError, UserError):  # a damaged ledger: its verify already failed on it
        return None
    if build is None or not build.complete:
        return None
    rel = dataset.relative_to(build.root).as_posix()
    doc = {"verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dataset_rel": rel,
           "output": build.output, "split": build.split, "report": report}
    path = build.root / VERIFY_DIR / verify_record_name(rel)
    try:
        atomic_write_json(path, json.loads(json.dumps(doc, default=str)))
    except OSError:
        return None
    return path


def latest(root: str | Path) -> list[dict[str, Any]]:
    """The verify records of the build at ``root`` (unreadable ones skipped), newest first."""
    folder = Path(root) / VERIFY_DIR
    docs = []
    for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = read_json(p)
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("report"), dict):
            docs.append(doc)
    return sorted(docs, key=lambda d: str(d.get("verified_at", "")), reverse=True)


def recorded(verify_fn):
    """``verify_fn`` (``runner.verify``) that also :func:`record`\\ s each report it returns."""
    import functools

    @functools.wraps(verify_fn)
    def run(dataset, *args: Any, **kwargs: Any) -> dict[str, Any]:
        report = verify_fn(dataset, *args, **kwargs)
        record(dataset, report)
        return report
    return run
