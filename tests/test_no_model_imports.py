"""A build without models (the README's quickstart: WebDataset shards and an EDM ZIP) never imports torch: it
took a second of every such build (2.2 s -> 0.7 s for the quickstart on the CPU machine). Neither does ``inspect``
of its shards (1.8 s -> 0.4 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_the_quickstart_build_does_not_import_torch(tmp_path):
    out = tmp_path / "qs"
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO / "examples/quickstart/recipe.yaml"), str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "torch imported: False" in r.stdout, r.stdout + r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["written"] == 206 and (out / "report.html").is_file()


INSPECT = """
import sys
from shardsmith.cli import app
try:
    app(["inspect", sys.argv[1]])
except SystemExit as exc:
    print("exit", exc.code)
print("torch imported:", "torch" in sys.modules)
"""


@pytest.mark.slow
def test_inspect_of_image_shards_does_not_import_torch(tmp_path):
    """``inspect`` decodes every image member as the loader does, without making tensors: it still finds a
    corrupt JPEG, and never imports torch for shards of images, captions, classes and JSON."""
    import io
    import tarfile

    from PIL import Image

    out = tmp_path / "qs"
    subprocess.run([sys.executable, "-m", "shardsmith", "build", str(REPO / "examples/quickstart/recipe.yaml"),
                    "--out", str(out), "-q", "--no-report"], check=True, capture_output=True)
    r = subprocess.run([sys.executable, "-c", INSPECT, str(out / "wds")], capture_output=True, text=True)
    assert "exit 0" in r.stdout and "torch imported: False" in r.stdout, r.stdout + r.stderr
    assert "178 sample(s)" in r.stdout, r.stdout
    bad = tmp_path / "bad"
    bad.mkdir()
    good = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(good, "JPEG")
    with tarfile.open(bad / "00000.tar", "w") as tar:
        for name, data in (("a.jpg", good.getvalue()), ("b.jpg", good.getvalue()[:40])):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    r = subprocess.run([sys.executable, "-c", INSPECT, str(bad)], capture_output=True, text=True)
    assert "torch imported: False" in r.stdout, r.stdout + r.stderr
    assert "exit 0" not in r.stdout and "corrupt member b.jpg: OSError" in r.stdout, r.stdout
