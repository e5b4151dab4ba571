"""Model configs checked before the plan (precheck.check_model_configs), second part:

- ``models.audio_vae.config`` given as a dict is built on the meta device like ``models.vae.config`` and
  ``models.teacher.config`` are: a key ``AutoencoderKLLTX2Audio`` (or, for its ``vocoder``, ``LTX2Vocoder``) does
  not take, a value it cannot be built from, settings that cannot be read and per-channel statistics that do not
  match the latents are one message naming the key, exit 2, before the plan (was a traceback from the model's
  constructor or load_audio_vae after the plan; keys starting with ``_`` pass, as for the others);
- a package the build's models need (diffusers, transformers) that is not installed is said as such, before the
  config check that would import it (was an ImportError traceback from the config check, or after the plan)."""

from __future__ import annotations

import os
import subprocess
import sys
import wave
from pathlib import Path

import pytest
import yaml

from test_cli_mistakes import assert_message, invoke

AUDIO = "models.audio_vae.config"


def _wav(path: Path, seconds: float = 1.5, rate: int = 16000) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x00\x01" * int(seconds * rate))
    return path


def _audio_recipe(tmp: Path, config) -> dict:
    src = tmp / "src"
    src.mkdir(exist_ok=True)
    _wav(src / "a.wav")
    (src / "a.txt").write_text("a tone")
    return {"sources": [{"path": str(src)}], "audio": {"durations": "1.0"}, "outputs": [{"format": "precomputed"}],
            "models": {"text": {"family": "minilm"}, "audio_vae": {"family": "ltx2_audio", "config": config},
                       "device": "cpu"}}


TINY = {"base_channels": 32, "ch_mult": [1, 1, 1], "num_res_blocks": 1, "latent_channels": 2}


@pytest.mark.parametrize("config, texts", [
    ({"nosuch": 1}, [AUDIO, "AutoencoderKLLTX2Audio takes no key 'nosuch'", "base_channels"]),
    ({"latnet_channels": 2}, [AUDIO, "'latnet_channels'", "did you mean 'latent_channels'"]),
    ({"base_channels": -1}, [AUDIO, "negative dimension", "cannot be built"]),
    ({"mel_bins": [64]}, [AUDIO, "TypeError", "cannot be read"]),
    ({"mel_hop_length": 0}, [AUDIO, "mel_hop_length 0", "at least 1"]),
    ({**TINY, "base_channels": 64}, [AUDIO, "64 entries", "2 x 16 = 32", "set base_channels to 32"]),
    ({**TINY, "vocoder": {"nosuch": 1}}, [f"{AUDIO}.vocoder", "LTX2Vocoder takes no key 'nosuch'"]),
    ({**TINY, "vocoder": "tiny"}, [f"{AUDIO}.vocoder", "'tiny' is not a dict"]),
])
def test_an_audio_vae_config_dict_the_class_refuses_is_refused_by_the_precheck(tmp_path, config, texts):
    from shardsmith.encode.vae import ModelConfigError
    from shardsmith.precheck import precheck
    from shardsmith.recipe import recipe_from_dict

    with pytest.raises(ModelConfigError) as got:
        precheck(recipe_from_dict(_audio_recipe(tmp_path, config)))
    for t in texts:
        assert t in str(got.value), str(got.value)


def test_an_audio_vae_config_dict_with_bookkeeping_keys_passes(tmp_path):
    """No false refusal: a dict pasted from a config.json (``_class_name``, ``_diffusers_version``), the named
    configs as dicts, and a dict without a vocoder pass the check."""
    from shardsmith.encode.audio_vae import CONFIGS, check_config
    from shardsmith.precheck import check_model_configs
    from shardsmith.recipe import recipe_from_dict

    pasted = {**TINY, "_class_name": "AutoencoderKLLTX2Audio", "_diffusers_version": "0.36.0", "n_fft": 512}
    check_model_configs(recipe_from_dict(_audio_recipe(tmp_path, pasted)))
    check_model_configs(recipe_from_dict(_audio_recipe(tmp_path, {**TINY, "vocoder": None})))
    for cfg in CONFIGS["ltx2_audio"].values():
        check_config("ltx2_audio", dict(cfg))


@pytest.mark.slow
def test_an_audio_vae_config_dict_is_one_message_before_the_plan(tmp_path):
    """Through the CLI: exit 2, no traceback, no output folder (was a TypeError traceback from
    AutoencoderKLLTX2Audio.__init__ once the plan was made)."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(_audio_recipe(tmp_path, {"nosuch": 1})))
    out = tmp_path / "out"
    code, output = invoke("build", recipe, "--out", out)
    assert_message(code, output, AUDIO, "'nosuch'", "named config")
    assert not out.exists()


# ----------------------------------------------------------------------------- a missing package comes first

def _latent_args(tmp: Path, *more: str) -> list[str]:
    from PIL import Image

    (tmp / "src").mkdir(exist_ok=True)
    Image.new("RGB", (64, 64), (200, 10, 10)).save(tmp / "src" / "a.jpg")
    return ["build", "--source", str(tmp / "src"), "--to", "latent_wds", "--set", "geometry.buckets=[64x64x1]",
            "--set", "models.vae.family=sd", "--set", "models.device=cpu", *more, "--out", str(tmp / "out")]


def _run_without(module: str, args: list[str]) -> subprocess.CompletedProcess:
    """``shardsmith ARGS`` in a process where ``module`` cannot be imported, as if it were not installed
    (``sys.modules`` maps it to None: its import raises ImportError and find_spec finds nothing)."""
    prelude = (f"import sys; sys.modules[{module!r}] = None; sys.argv = ['shardsmith', *sys.argv[1:]]; "
               "from shardsmith.cli import main; main()")
    return subprocess.run([sys.executable, "-c", prelude, *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_a_missing_diffusers_is_said_before_a_config_dict_is_checked(tmp_path):
    """The VAE's config dict is checked by building its diffusers class: without diffusers that was an
    ImportError traceback from the check; now the missing package, its install line, exit 2, no output folder.
    The dict is a bad one too: the package is said first."""
    r = _run_without("diffusers", _latent_args(tmp_path, "--set", "models.vae.config={nosuch: 1}"))
    assert_message(r.returncode, r.stdout + r.stderr, "models.vae (sd)", "needs the diffusers package",
                   "is not installed", "pip install diffusers")
    assert "nosuch" not in r.stdout + r.stderr
    assert not (tmp_path / "out").exists()


def test_a_missing_transformers_is_said_before_the_plan(tmp_path):
    """A text encoder needs transformers: its absence was an ImportError traceback once the plan was made and
    the text model loaded (the VAE's dict check imports diffusers without it); now one message first."""
    r = _run_without("transformers", _latent_args(tmp_path, "--set", "models.vae.config={latent_channels: 4}",
                                                  "--set", "models.text.family=minilm"))
    assert_message(r.returncode, r.stdout + r.stderr, "models.text (minilm) needs the transformers package",
                   "pip install transformers")
    assert not (tmp_path / "out").exists()


def test_a_model_package_whose_import_fails_in_the_config_check_is_a_message(tmp_path, monkeypatch):
    """Installed (find_spec finds it) but its import fails while the config dict is checked: the package and its
    install line, naming the key, not an ImportError."""
    from shardsmith.encode import audio_vae
    from shardsmith.precheck import MissingPackageError, check_model_configs, check_packages
    from shardsmith.recipe import recipe_from_dict

    def fails(name, lean=False):
        raise ImportError("No module named 'diffusers'", name="diffusers")

    monkeypatch.setattr(audio_vae, "model_class", fails)
    rec = recipe_from_dict(_audio_recipe(tmp_path, {"nosuch": 1}))
    check_packages(rec)  # (installed)
    with pytest.raises(MissingPackageError) as got:
        check_model_configs(rec)
    assert "models.audio_vae.config" in str(got.value) and "pip install diffusers" in str(got.value)


def test_check_packages_runs_before_the_config_check():
    from shardsmith.precheck import CHECKS, check_model_configs, check_packages

    assert CHECKS.index(check_packages) < CHECKS.index(check_model_configs)
