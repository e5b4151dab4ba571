"""The CLI's process imports diffusers' model classes without peft (shardsmith.encode.diffusers_import):
with a peft installed, an audio build through ``shardsmith build`` never imports it and writes its latents;
a library caller's process keeps diffusers' peft integration (the installed peft is imported as before)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from video_factory import audio_file

pytestmark = pytest.mark.slow


def _fake_peft(root: Path) -> Path:
    """A peft that diffusers takes as installed (a dist-info of 0.17.0 and the names its modules import),
    which writes the file named by $FAKE_PEFT_MARKER when imported."""
    pkg = root / "peft"
    (pkg / "tuners").mkdir(parents=True)
    (pkg / "__init__.py").write_text('import os\nopen(os.environ["FAKE_PEFT_MARKER"], "w").write("imported")\n'
                                     '__version__ = "0.17.0"\n')
    (pkg / "helpers.py").write_text("def disable_input_dtype_casting(*a, **k):\n    pass\n")
    (pkg / "tuners" / "__init__.py").write_text("")
    (pkg / "tuners" / "tuners_utils.py").write_text("class BaseTunerLayer:\n    pass\n")
    info = root / "peft-0.17.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: peft\nVersion: 0.17.0\n")
    (info / "top_level.txt").write_text("peft\n")
    return root


def _env(fake: Path, marker: Path) -> dict:
    path = os.pathsep.join([str(fake), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "FAKE_PEFT_MARKER": str(marker), "HF_HUB_OFFLINE": "1"}


def test_an_audio_build_through_the_cli_does_not_import_peft_and_a_library_process_does(tmp_path):
    fake = _fake_peft(tmp_path / "site")
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        audio_file(src / f"s{i}.wav", duration=1.5 + 0.1 * i, rate=16000, layout="stereo")  # distinct bytes
    rec = tmp_path / "recipe.yaml"
    rec.write_text(yaml.safe_dump({
        "sources": [{"path": str(src)}],
        "models": {"audio_vae": {"family": "ltx2_audio", "config": "tiny"}, "batch_size": 2, "device": "cpu"},
        "audio": {"durations": "1.0"}, "outputs": [{"format": "latent_wds", "dir": "audio"}]}))

    marker = tmp_path / "peft_imported"
    r = subprocess.run([sys.executable, "-m", "shardsmith", "build", str(rec), "--out", str(tmp_path / "out"),
                        "--no-report", "-q"], capture_output=True, text=True, env=_env(fake, marker), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["counts"]["written"] == 3
    assert not marker.exists(), "the CLI's build imported peft"

    # a library caller's process: diffusers as installed, peft imported by its hooks, and reported available
    probe = ("from shardsmith.encode.diffusers_import import diffusers_class\n"
             "import sys, json\n"
             "cls = diffusers_class('AutoencoderKLLTX2Audio')\n"
             "from diffusers.utils import is_peft_available\n"
             "print(json.dumps([cls.__name__, 'peft' in sys.modules, is_peft_available()]))\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=_env(fake, marker),
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == ["AutoencoderKLLTX2Audio", True, True]
    assert marker.read_text() == "imported"

    # the CLI's way, in one process: the class without peft, and peft reported available again afterwards
    marker.unlink()
    r = subprocess.run([sys.executable, "-c", "from shardsmith.encode import diffusers_import\n"
                        "diffusers_import.HIDE_PEFT = True\n" + probe], capture_output=True, text=True,
                       env=_env(fake, marker), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == ["AutoencoderKLLTX2Audio", False, True]
    assert not marker.exists()
