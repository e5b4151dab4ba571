"""Counts and the reconciliation invariant: ``inputs == written + skipped + failed``.

``tally(rows)`` turns (split, item_id, status, detail) rows into count blocks of the
manifest shape::

    {"inputs": N, "written": W, "skipped": {"<reason>": n}, "failed": {"<reason>": n},
     "examples": {"<status>": {"ids": [...], "detail": "..."}}}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MAX_EXAMPLES = 5


def empty_block() -> dict[str, Any]:
    return {"inputs": 0, "written": 0, "skipped": {}, "failed": {}, "examples": {}}


def add(block: dict[str, Any], item_id: str, status: str, detail: str | None) -> None:
    block["inputs"] += 1
    if status == "written":
        block["written"] += 1
        return
    kind, _, reason = status.partition(":")
    if kind not in ("skipped", "failed") or not reason:
        raise ValueError(f"bad status {status!r} for {item_id}")
    block[kind][reason] = block[kind].get(reason, 0) + 1
    ex = block["examples"].setdefault(status, {"ids": [], "detail": detail})
    if len(ex["ids"]) < MAX_EXAMPLES:
        ex["ids"].append(item_id)


def balanced(block: dict[str, Any]) -> bool:
    return block["inputs"] == block["written"] + sum(block["skipped"].values()) + sum(block["failed"].values())


def tally(rows: Iterable[tuple[str, str, str, str | None]],
          written: dict[str, int] | None = None) -> tuple[dict, dict[str, dict]]:
    """(overall block, {split: block}) from (split, item_id, status, detail) rows, plus
    ``written`` ({split: count}) items that are written and need no row each (a long build's
    hundreds of thousands of written items are counted in SQL, not one by one)."""
    total, splits = empty_block(), {}
    for split, n in (written or {}).items():
        for block in (total, splits.setdefault(split, empty_block())):
            block["inputs"] += n
            block["written"] += n
    for split, item_id, status, detail in rows:
        add(total, item_id, status, detail)
        add(splits.setdefault(split, empty_block()), item_id, status, detail)
    return total, splits


_RANK = {"failed": 2, "skipped": 1, "written": 0}


def worst(statuses: list[tuple[str, str | None]]) -> tuple[str, str | None]:
    """An item's overall status across outputs: any failure beats any skip beats written."""
    return max(statuses, key=lambda s: _RANK[s[0].partition(":")[0]])


def format_block(name: str, block: dict[str, Any]) -> list[str]:
    ok = "OK" if balanced(block) else "MISMATCH"
    skipped, failed = sum(block["skipped"].values()), sum(block["failed"].values())
    lines = [f"{name}: inputs {block['inputs']} = written {block['written']} + skipped {skipped} "
             f"+ failed {failed}  [{ok}]"]
    for kind in ("skipped", "failed"):
        for reason, n in sorted(block[kind].items()):
            ex = block["examples"].get(f"{kind}:{reason}", {})
            lines.append(f"    {kind}:{reason} x{n}  e.g. {', '.join(ex.get('ids', [])[:3])}")
    return lines
