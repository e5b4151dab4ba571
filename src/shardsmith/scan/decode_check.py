"""The transform's full decode of every image the plan read, recorded beside the plan.

The planner's probe opens an image header only; a build decodes the pixels later, at the
transform, where a truncated or corrupt file fails. Scan runs that decode now so those files
are found before a build, and so that pictures are counted as the transform sees them
(upright, after EXIF rotation).

Contract: :func:`decode_all` reads every ``items`` row of kind ``image`` whose bytes the probe
read (``sha256`` set; duplicate copies and items with a caption problem included), with the
build's read (:func:`~shardsmith.transform.samples.read_checked`) and decoder, in plan order,
in bounded batches on a thread pool; no pixels are kept. It writes one ``decoded`` row per
such item and one ``decoded_notes`` row per decode note, in plan order, into the dry run's
throwaway database (never into a build's ledger).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from shardsmith.plan.ledger import Ledger
from shardsmith.recipe import ImageRules
from shardsmith.records import ItemError, PlannedItem
from shardsmith.transform.image import decode_image
from shardsmith.transform.samples import read_checked

BATCH = 256

_SCHEMA = """
CREATE TABLE decoded (
    idx INTEGER PRIMARY KEY,  -- items.idx
    status TEXT NOT NULL,  -- 'ok' or the transform's 'failed:<reason>'
    detail TEXT,
    width INTEGER,  -- upright, as the transform sees it
    height INTEGER,
    mode TEXT,  -- as stored in the file, before conversion
    format TEXT
);
CREATE TABLE decoded_notes (idx INTEGER NOT NULL, note TEXT NOT NULL);
"""


@dataclass(frozen=True)
class Decoded:
    """What decoding one item taught (no pixels)."""

    idx: int
    status: str = "ok"
    detail: str | None = None
    width: int | None = None
    height: int | None = None
    mode: str | None = None
    format: str | None = None
    notes: tuple[str, ...] = ()


def decode_one(item: PlannedItem, rules: ImageRules) -> Decoded:
    """Decode ``item`` as the transform would; a failure is the transform's status and detail."""
    try:
        dec = decode_image(read_checked(item), name=item.item_id, max_pixels=rules.max_pixels,
                           background=tuple(rules.background))
    except ItemError as exc:
        return Decoded(item.idx, exc.status, exc.detail)
    except Exception as exc:  # noqa: BLE001 - any decoder crash is this item's problem
        return Decoded(item.idx, "failed:decode_error", f"{item.item_id} cannot be decoded: {exc}")
    w, h = dec.image.size
    return Decoded(item.idx, width=w, height=h, mode=dec.source_mode, format=dec.source_format,
                   notes=tuple(dec.notes))


def decode_all(ledger: Ledger, rules: ImageRules, threads: int, on_total=None, tick=None) -> None:
    """Fill ``decoded`` and ``decoded_notes`` for every image row the plan read (see the module).
    ``on_total(n)``: told how many images will be decoded, first; ``tick(k)`` after each batch of ``k``."""
    db = ledger.db
    db.executescript(_SCHEMA)
    if on_total is not None:
        on_total(db.execute("SELECT COUNT(*) FROM items WHERE kind = 'image' AND sha256 IS NOT NULL").fetchone()[0])
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for lo in range(0, ledger.count_items(), BATCH):  # plan idx run 0..n-1
            batch = [it for it in ledger.items(idx_range=(lo, lo + BATCH))
                     if it.kind == "image" and it.sha256 is not None]
            done = list(pool.map(lambda it: decode_one(it, rules), batch))
            with ledger.transaction():
                db.executemany("INSERT INTO decoded VALUES (?,?,?,?,?,?,?)",
                               [(d.idx, d.status, d.detail, d.width, d.height, d.mode, d.format) for d in done])
                db.executemany("INSERT INTO decoded_notes VALUES (?,?)",
                               [(d.idx, n) for d in done for n in d.notes])
            if tick is not None and done:
                tick(len(done))
