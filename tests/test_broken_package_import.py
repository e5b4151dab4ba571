"""An installed model library whose import fails (a broken dependency: a shared library that is not there) in a
build whose models have named configs (``tiny``, ``published``): it was the import's traceback when the models
loaded (exit 1); now one message, exit code 2, naming the package, the models that need it, the import error's
last line and the fix (``pip install --force-reinstall <the version shardsmith pins>``), and no cache written.

The failure is made by a ``sitecustomize`` on ``PYTHONPATH`` whose meta-path finder finds the module (so
``find_spec``, as the precheck asks, says it is installed) and whose loader raises on import."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from media_factory import real_photos

HOOK = '''
import importlib.abc, importlib.util, sys

BROKEN = {broken!r}


class _Broken(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise {error}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == BROKEN:
            return importlib.util.spec_from_loader(name, _Broken(), is_package=True)
        return None


sys.meta_path.insert(0, _Finder())
'''


def _pin(dist: str) -> str:
    """``dist==X`` as shardsmith's metadata pins it (the version the message asks to reinstall)."""
    for r in importlib.metadata.requires("shardsmith") or []:
        if r.lower().startswith(f"{dist}==") and "extra ==" not in r:
            return r.split(";")[0].strip()
    return dist


def _build(tmp_path: Path, broken: str, error: str, models: dict,
           output: str = "precomputed") -> tuple[subprocess.CompletedProcess, Path]:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK.format(broken=broken, error=error), encoding="utf-8")
    src = tmp_path / "src"
    real_photos(src, 2, seed=81, min_side=48, max_side=80)
    for p in src.glob("*.jpg"):
        p.with_suffix(".txt").write_text("a photo", encoding="utf-8")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": str(src)}], "geometry": {"buckets": ["64x64x1"]}, "images": {"upscale": True},
        "models": {**models, "device": "cpu"}, "outputs": [{"format": output}]}), encoding="utf-8")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "shardsmith", "build", str(recipe), "--out", str(out)],
                       capture_output=True, text=True, env=env)
    return r, out


def _no_cache_written(out: Path) -> None:
    written = [p for p in out.rglob("*") if p.suffix in (".pt", ".tar")]
    assert not written, written


@pytest.mark.slow
def test_diffusers_that_fails_on_import_is_one_message(tmp_path):
    r, out = _build(tmp_path, "diffusers", 'ImportError("libfoo.so: cannot open shared object file: No such file '
                                           'or directory")',
                    {"vae": {"family": "sd", "config": "tiny"}, "text": {"family": "minilm"}})
    output = r.stdout + r.stderr
    assert r.returncode == 2, output
    assert "Traceback" not in output
    err = r.stderr.strip()
    assert err.startswith("error: ") and err.count("error: ") == 1, err
    assert "models.vae (sd) and models.text (minilm) need the diffusers package" in err
    assert "installed but cannot be imported (ImportError: libfoo.so: cannot open shared object file" in err
    assert f"pip install --force-reinstall {_pin('diffusers')}" in err and "==" in _pin("diffusers")
    _no_cache_written(out)


@pytest.mark.slow
def test_transformers_that_fails_on_import_is_one_message(tmp_path):
    """diffusers imports (without transformers: the build's only transformers model is the text encoder); then
    transformers' own import fails, with a multi-line OSError: its last line is said, the package is
    transformers and the models named are those that need it."""
    r, out = _build(tmp_path, "transformers",
                    'OSError("while loading the tokenizers backend\\nlibbar.so.3: cannot open shared object file")',
                    {"vae": {"family": "sd", "config": "published"}, "text": {"family": "minilm"}})
    output = r.stdout + r.stderr
    assert r.returncode == 2, output
    assert "Traceback" not in output
    err = r.stderr.strip()
    assert "models.text (minilm) needs the transformers package, which is installed but cannot be imported " \
           "(OSError: libbar.so.3: cannot open shared object file)" in err, err
    assert "while loading the tokenizers backend" not in err
    assert f"pip install --force-reinstall {_pin('transformers')}" in err and "==" in _pin("transformers")
    _no_cache_written(out)


@pytest.mark.slow
def test_a_diffusers_module_that_fails_under_its_lazy_import(tmp_path):
    """diffusers itself imports; the VAE's module does not (diffusers' lazy module wraps the error in a
    RuntimeError "Failed to import ..."): the error behind it is said."""
    r, out = _build(tmp_path, "diffusers.models.autoencoders",
                    'OSError("libcudart.so.13: cannot open shared object file: No such file or directory")',
                    {"vae": {"family": "sd"}}, output="latent_wds")
    output = r.stdout + r.stderr
    assert r.returncode == 2, output
    assert "Traceback" not in output and "RuntimeError" not in output
    err = r.stderr.strip()
    assert "models.vae (sd) needs the diffusers package, which is installed but cannot be imported " \
           "(OSError: libcudart.so.13: cannot open shared object file: No such file or directory)" in err, err
    assert f"pip install --force-reinstall {_pin('diffusers')}" in err
    _no_cache_written(out)
