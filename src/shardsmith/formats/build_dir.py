"""The files a shardsmith build keeps in its output folder besides the datasets.

``manifest.json`` (counts, provenance, batch contract), ``.shardsmith/ledger.sqlite`` (every
item's status), ``.shardsmith/lock`` (held by a build or repair for its whole life) and the
held-out split's outputs below ``holdout/``.
"""

from __future__ import annotations

MANIFEST_FILE = "manifest.json"
STATE_DIR = ".shardsmith"
LEDGER_FILE = ".shardsmith/ledger.sqlite"
LOCK_FILE = ".shardsmith/lock"  # fcntl.flock, held by a build or repair for its whole life
HOLDOUT_DIR = "holdout"  # the held-out split's outputs, below the build folder
ENCODED_DIR = ".shardsmith/encoded"  # encoder results kept while several outputs need them (encode/memo.py)
ZIP_STAGE_DIR = ".shardsmith/stage"  # a ZIP output's staged units, per output and split
REPORT_FILE = "report.html"  # the HTML report (``shardsmith report``; written by ``build`` unless --no-report)
VERIFY_DIR = ".shardsmith/verify"  # the last ``verify`` report of each dataset of the build


def verify_record_name(dataset_rel: str) -> str:
    """The file (in :data:`VERIFY_DIR`) holding the last verify report of the dataset at
    ``dataset_rel`` (relative to the build folder): ``holdout/wds`` -> ``holdout__wds.json``."""
    return dataset_rel.strip("/").replace("/", "__") + ".json"
