"""``inspect`` and ``repair`` of an LTX ``.precomputed/`` tree (layout: :mod:`shardsmith.formats.precomputed`).

- :func:`inspect_precomputed`: per folder its ``.pt`` count; files without a partner (a
  ``latents/x.pt`` with no ``conditions/x.pt`` and the reverse: the LTX trainer silently skips
  them); ``.pt`` files that do not load (``torch.load(weights_only=True)``, as the trainer loads
  them); the shapes within each folder. Problems: unpaired, unreadable, a folder with several
  condition (or mask) shapes. Several latent shapes are a warning, not a problem: the tree trains,
  but "the LTX trainer needs batch_size: 1 for this tree" (its DataLoader stacks a batch). For a tree a
  finished shardsmith build wrote, ``integrity`` (verify's check, :class:`shardsmith.verify.integrity.TreeIntegrity`:
  every unit's files against the sha256 the build's ledger recorded, hashed in threads while the files are
  read); a failure is a problem.
- :func:`repair_precomputed`: moves every unreadable and unpaired file (never deletes) into the
  quarantine folder below the tree's build state (``formats.precomputed.QUARANTINE_DIR``), with a
  ``repair.json`` there listing each move and why; ``dry_run`` reports the same moves and writes
  nothing. The build folder's lock is held meanwhile, as for a WebDataset repair; a tree of an
  unfinished build, or one whose folders (or the build's state folder) cannot be written, is refused
  before any change, as there (``verify.repair``).
- :func:`from_source_refusal`: what ``repair --from-source`` of a tree says (it rebuilds WebDataset shards
  only): repair it without the flag, then what truly puts the moved files back. For a tree of a shardsmith
  build that is the build's command again with ``--overwrite`` (a finished build re-run as it was is
  "complete; nothing to do": a resume re-encodes nothing), which rebuilds the tree from the sources beside
  the old one and swaps it in, keeping the quarantine (carried into the rebuilt folder); for any
  other tree, the tool that wrote it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from shardsmith.formats import precomputed as layout
from shardsmith.formats.build_dir import STATE_DIR
from shardsmith.formats.detect import enclosing_build
from shardsmith.user_paths import resolve_user_path

EXAMPLES = 5


def _shape(value: Any, key: str | None) -> tuple[int, ...] | None:
    import torch

    v = value.get(key) if isinstance(value, dict) and key else value
    return tuple(v.shape) if torch.is_tensor(v) else None


def inspect_precomputed(root: str | Path, progress: Any = None) -> dict[str, Any]:
    """The report of a ``.precomputed/`` tree (module docstring): ``{"folder", "kind":
    "precomputed", "dirs": {dir: {"files", "unreadable": [{"file", "error"}], "shapes": {shape:
    count}}}, "unpaired": [{"file", "in", "missing"}], "problems": [str], "warnings": [str],
    "samples" (files present and readable in every folder), "ok"}``. ``progress``: a
    :class:`~shardsmith.progress.Progress` that shows a bar over the files read."""
    from contextlib import nullcontext

    from shardsmith.verify.integrity import tree_integrity
    from shardsmith.verify.owning_build import BuildUnreadable, find_build, unfinished_build

    root = Path(root)
    chk = None
    if unfinished_build(root) is None:
        try:
            chk, _ = tree_integrity(root, find_build(root))
        except BuildUnreadable:
            chk = None
    try:
        if chk is not None:
            chk.start()
        report = _inspect_tree(root, progress)
        if chk is not None:
            checked: list[dict[str, Any]] = []
            chk.finish(lambda name, ok, detail: checked.append({"name": name, "ok": ok, "detail": detail}))
            report["integrity"] = checked[0]
            if not checked[0]["ok"]:
                report["problems"].append(f"integrity: {checked[0]['detail']}")
                report["ok"] = False
    finally:
        if chk is not None:
            chk.close()
    return report


def _inspect_tree(root: Path, progress: Any) -> dict[str, Any]:
    from contextlib import nullcontext

    dirs = layout.present_dirs(root)
    files = {d: layout.cache_files(root, d) for d in dirs}
    have = {d: set(f) for d, f in files.items()}
    report: dict[str, Any] = {"folder": str(root), "kind": "precomputed", "dirs": {}, "unpaired": [],
                              "problems": [], "warnings": []}
    bad: set[tuple[str, str]] = set()
    bar = progress.task(f"read {root.name}", total=sum(len(f) for f in files.values())) if progress else nullcontext()
    with bar as tick:
        for d in dirs:
            _read_dir(root, d, files[d], report, bad, tick)
    every = set().union(*have.values()) if have else set()
    for rel in sorted(every):
        missing = [d for d in dirs if rel not in have[d]]
        if missing:
            report["unpaired"].append({"file": rel, "in": [d for d in dirs if rel in have[d]], "missing": missing})
    report["samples"] = sum(1 for rel in every if all(rel in have[d] and (d, rel) not in bad for d in dirs))

    if not dirs:
        report["problems"].append(f"no {', '.join(layout.MARKER_DIRS)} folder: not a .precomputed/ tree")
    n_bad = sum(len(e["unreadable"]) for e in report["dirs"].values())
    if n_bad:
        ex = [u["file"] for e in report["dirs"].values() for u in e["unreadable"]][:EXAMPLES]
        report["problems"].append(f"{n_bad} .pt file(s) do not load (torch.load weights_only=True), e.g. {ex}; "
                                  "the LTX trainer fails on them")
    if report["unpaired"]:
        u = report["unpaired"][0]
        report["problems"].append(
            f"{len(report['unpaired'])} file(s) without a partner in every folder, e.g. {u['in'][0]}/{u['file']} "
            f"missing in {u['missing']}; the LTX trainer silently skips them")
    for d, e in report["dirs"].items():
        if len(e["shapes"]) > 1:
            shapes = ", ".join(f"{s} ({n})" for s, n in sorted(e["shapes"].items()))
            if d in (layout.LATENTS, layout.REFERENCE_LATENTS, layout.AUDIO_LATENTS, layout.REFERENCE_AUDIO_LATENTS):
                report["warnings"].append(f"{d}/ holds {len(e['shapes'])} latent shapes: {shapes}; "
                                          "the LTX trainer needs batch_size: 1 for this tree")
            else:
                report["problems"].append(f"{d}/ holds {len(e['shapes'])} shapes: {shapes}; one folder's caches "
                                          "must come from one encoder and settings")
    report["ok"] = not report["problems"]
    return report


def format_inspect_precomputed(report: dict[str, Any]) -> str:
    lines = [f"inspect {report['folder']} (.precomputed/ tree): {report['samples']} complete sample(s)"]
    for d, e in report["dirs"].items():
        shapes = ", ".join(f"{s} x{n}" for s, n in sorted(e["shapes"].items())) or "-"
        lines.append(f"  {d + '/':<26} {e['files']:>6} .pt  unreadable {len(e['unreadable'])}  shapes {shapes}")
    for u in report["unpaired"][:EXAMPLES]:
        lines.append(f"  unpaired: {u['in'][0]}/{u['file']} (missing in {', '.join(u['missing'])})")
    for d, e in report["dirs"].items():
        for u in e["unreadable"][:EXAMPLES]:
            lines.append(f"  unreadable: {u['file']}: {u['error']}")
    lines += [f"problem: {p}" for p in report["problems"]]
    lines += [f"warning: {w}" for w in report["warnings"]]
    lines.append("OK" if report["ok"] else "PROBLEMS")
    return "\n".join(lines)


def quarantine_dir(root: Path) -> Path:
    """Where :func:`repair_precomputed` moves files (before the per-run time folder)."""
    root = Path(root).resolve()
    build = enclosing_build(root)
    if build is not None and build.root != root:
        return build.root / STATE_DIR / layout.QUARANTINE_DIR / root.relative_to(build.root)
    return root / STATE_DIR / layout.QUARANTINE_DIR


#: what a ``.precomputed/`` repair changes in place (said when it cannot)
MOVES = ("moves unreadable and unpaired .pt files out of the tree's folders into the quarantine below the build's "
         "state folder")


def repair_precomputed(root: str | Path, *, dry_run: bool = False) -> dict[str, Any]:
    """Move every unreadable and unpaired file of the tree into the quarantine (module docstring).
    Report: ``{"folder", "dry_run", "quarantine" (the folder of this run), "moved": [{"file",
    "reason", "to"}], "inspect" (before), "after" (the inspect report after; None for a dry run),
    "errors"}``."""
    from shardsmith.verify.repair import REPAIR_THEN, refuse_unfinished_build, repair_lock

    root = Path(root)
    refuse_unfinished_build(root, REPAIR_THEN)
    build = enclosing_build(resolve_user_path(root))
    writes = [root / d for d in layout.present_dirs(root)]  # (its files move out of them)
    with repair_lock(build.root if build else root, dry_run, root, writes, MOVES):
        before = inspect_precomputed(root)
        moves: list[tuple[str, str]] = []
        for e in before["dirs"].values():
            moves += [(u["file"], f"unreadable: {u['error']}") for u in e["unreadable"]]
        unreadable = {f for f, _ in moves}
        for u in before["unpaired"]:
            moves += [(f"{d}/{u['file']}", f"unpaired: missing in {', '.join(u['missing'])}") for d in u["in"]
                      if f"{d}/{u['file']}" not in unreadable]
        # a partner left alone once its unreadable twin goes is unpaired after the move: it goes too
        taken = {f for f, _ in moves}
        for f in sorted(unreadable):
            d, rel = f.split("/", 1)
            for o in before["dirs"]:
                if o != d and f"{o}/{rel}" not in taken and (root / o / rel).is_file():
                    moves.append((f"{o}/{rel}", f"unpaired: its partner {f} is unreadable"))
                    taken.add(f"{o}/{rel}")
        dest = quarantine_dir(root) / time.strftime("%Y%m%dT%H%M%S")
        report: dict[str, Any] = {"folder": str(root), "dry_run": dry_run, "quarantine": str(dest),
                                  "moved": [{"file": f, "reason": why, "to": str(dest / f)} for f, why in moves],
                                  "inspect": before, "after": None, "errors": []}
        if dry_run or not moves:
            return report
        for f, _ in moves:
            target = dest / f
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                (root / f).rename(target)  # same file system (below the build): a move, never a copy and delete
            except OSError as e:
                report["errors"].append(f"{f}: {e}")
        tmp = dest / "repair.json.tmp"
        tmp.write_text(json.dumps({"tree": str(root.resolve()), "moved": report["moved"],
                                   "errors": report["errors"]}, indent=2, ensure_ascii=False), encoding="utf-8")
        tmp.replace(dest / "repair.json")
        report["after"] = inspect_precomputed(root)
    return report


def from_source_refusal(tree: str | Path) -> str:
    """The message of ``repair --from-source`` on the ``.precomputed/`` tree ``tree`` (see the module doc)."""
    build = enclosing_build(resolve_user_path(tree))
    head = (f"--from-source rebuilds WebDataset shards; {tree} is a .precomputed/ tree. Run shardsmith repair {tree} "
            "without it (it moves unreadable and unpaired .pt files out of the tree, into a quarantine folder)")
    if build is None or not build.has_manifest:
        return (f"{head}, then make the moved files again with the tool that wrote the tree (no shardsmith build "
                "holds it, so shardsmith has no sources to rebuild them from)")
    quarantine = quarantine_dir(tree)
    return (f"{head}, then rebuild them from the sources: re-run the build's command with --overwrite "
            f"(shardsmith build ... --out {build.root} --overwrite: the tree is built again beside the old one and "
            "swapped in when complete). Without --overwrite the re-run finds the build complete and puts nothing "
            f"back. The moved files stay in {quarantine}, carried into the rebuilt folder")


def format_repair_precomputed(report: dict[str, Any]) -> str:
    verb = "would move" if report["dry_run"] else "moved"
    lines = [f"repair {report['folder']} (.precomputed/ tree): {verb} {len(report['moved'])} file(s) to "
             f"{report['quarantine']} (nothing is deleted)"]
    lines += [f"  {m['file']}: {m['reason']}" for m in report["moved"][:20]]
    if len(report["moved"]) > 20:
        lines.append(f"  ... and {len(report['moved']) - 20} more")
    lines += [f"error: {e}" for e in report["errors"]]
    after = report.get("after")
    if after is not None:
        lines.append(f"after: {after['samples']} complete sample(s); " + ("OK" if after["ok"] else
                     "still: " + "; ".join(after["problems"])))
    lines += [f"warning: {w}" for w in (after or report["inspect"])["warnings"]]
    return "\n".join(lines)


def _read_dir(root: Path, d: str, files: list[str], report: dict[str, Any], bad: set[tuple[str, str]], tick) -> None:
    """Load every ``.pt`` of folder ``d``: its unreadable files and its shapes into ``report``."""
    from shardsmith.loaders.pth_fast import load_pth_bytes

    entry = {"files": len(files), "unreadable": [], "shapes": {}}
    for rel in files:
        if tick is not None:
            tick()
        try:
            value = load_pth_bytes((root / d / rel).read_bytes())
        except Exception as e:  # noqa: BLE001 - any load failure is the finding
            entry["unreadable"].append({"file": f"{d}/{rel}", "error": f"{type(e).__name__}: {e}"[:200]})
            bad.add((d, rel))
            continue
        shape = _shape(value, layout.SHAPE_KEYS.get(d))
        key = "x".join(map(str, shape)) if shape is not None else "no tensor"
        entry["shapes"][key] = entry["shapes"].get(key, 0) + 1
    report["dirs"][d] = entry
