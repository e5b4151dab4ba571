"""Every on-disk layout shardsmith writes or reads, in one place, so that what writes a dataset
and what reads it cannot disagree. Light to import (no torch, PIL or webdataset) and importing
nothing from sinks, loaders or verify.

- :mod:`~shardsmith.formats.wds`: WebDataset shard and member names, index files, shard listing.
- :mod:`~shardsmith.formats.tar`: tar block arithmetic and header reading.
- :mod:`~shardsmith.formats.zip`: the EDM class-conditional ZIP.
- :mod:`~shardsmith.formats.precomputed`: the LTX ``.precomputed/`` tree.
- :mod:`~shardsmith.formats.build_dir`: a build folder's manifest, ledger, lock and holdout folder.
- :mod:`~shardsmith.formats.detect`: what kind of dataset a path is.

The names below are re-exported for ``from shardsmith import formats; formats.X``.
"""

from shardsmith.formats.build_dir import (ENCODED_DIR, HOLDOUT_DIR, LEDGER_FILE, LOCK_FILE, MANIFEST_FILE, STATE_DIR,
                                          ZIP_STAGE_DIR)
from shardsmith.formats.precomputed import PRECOMPUTED_STAMP
from shardsmith.formats.tar import tar_header_name, tar_header_ok
from shardsmith.formats.wds import (
    IGNORE_INDEX_FILE,
    MAX_KEY_LEN,
    NEG_PROMPT_FILE,
    REPAIR_FILE,
    SHARD_COUNT_FILE,
    key_base,
    member_name,
    numeric_stem,
    sanitize_key,
    shard_index,
    shard_name,
    sort_shard_names,
    split_member,
    unique_key,
    without_suffix,
)
from shardsmith.formats.zip import ZIP_LABELS_FILE, zip_member_name

__all__ = [
    "ENCODED_DIR", "HOLDOUT_DIR", "IGNORE_INDEX_FILE", "LEDGER_FILE", "LOCK_FILE", "MANIFEST_FILE",
    "MAX_KEY_LEN", "NEG_PROMPT_FILE", "PRECOMPUTED_STAMP", "REPAIR_FILE", "SHARD_COUNT_FILE", "STATE_DIR",
    "ZIP_LABELS_FILE", "ZIP_STAGE_DIR", "key_base", "member_name", "numeric_stem", "sanitize_key", "shard_index", "shard_name",
    "sort_shard_names", "split_member", "tar_header_name", "tar_header_ok", "unique_key", "without_suffix",
    "zip_member_name",
]
