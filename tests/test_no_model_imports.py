"""A build without models (the README's quickstart: WebDataset shards and an EDM ZIP) never imports torch: it
took a second of every such build (2.2 s -> 0.7 s for the quickstart on the CPU machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SCRIPT = """
import sys
from shardsmith.cli import app
try:
    app(["build", sys.argv[1], "--out", sys.argv[2], "-q"])
except SystemExit as exc:
    assert not exc.code, exc.code
print("torch imported:", "torch" in sys.modules)
"""


def test_the_quickstart_build_does_not_import_torch(tmp_path):
    out = tmp_path / "qs"
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO / "examples/quickstart/recipe.yaml"), str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "torch imported: False" in r.stdout, r.stdout + r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["written"] == 206 and (out / "report.html").is_file()
