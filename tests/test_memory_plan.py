"""Planning numbers before a run (issue 23): each model's weights and peak at its batch, whether it fits,
the largest batch that fits, the expected time; ``scan --probe-models``. GPU peaks are measured on the
H200 (BENCHMARKS.md §11); here the arithmetic, the weight count (quantised weights included) and the CLI."""

import json
import os
import subprocess
import sys

import pytest
import torch

from media_factory import real_photos
from shardsmith.encode.memory_plan import (ModelMemory, largest_batch, memory_block, param_bytes, summary,
                                          text_fits_beside)

GIB = 2 ** 30


def test_peak_arithmetic_fits_and_largest_batch():
    m = ModelMemory("vae", "sd (published, random-weights) @ 256x256x1", 32, 2 * GIB, 2 * GIB + 32 * 100 * 2 ** 20,
                    seconds=0.5)
    assert m.per_item_bytes == 100 * 2 ** 20 and m.items_per_s == 64.0
    # 0.9 x 10 GiB = 9 GiB: 2 GiB of weights + b x 100 MiB -> b <= 71.68: the largest power of two is 64
    assert largest_batch(m, 10 * GIB) == 64
    assert largest_batch(m, GIB) == 0  # the weights alone do not fit
    ok, = summary([m], free=10 * GIB, total=16 * GIB, items=6400)
    assert "peak 5.12 GiB at batch 32" in ok and "32.0 % of the GPU's 16.00 GiB" in ok and "; fits;" in ok
    assert "the largest batch that fits: 64" in ok and "~100 s for 6400 items" in ok
    bad, = summary([m], free=4 * GIB, total=16 * GIB)
    assert "does NOT fit the 4.00 GiB free: lower models.batch_size" in bad and "largest batch that fits: 16" in bad
    cpu, = summary([ModelMemory("text", "t5 (tiny)", 8, GIB, None, seconds=0.1)], None, None, items=80)
    assert "measured on a GPU only" in cpu and "80.0 items/s at batch 8, ~1 s for 80 items" in cpu
    text = ModelMemory("text", "gemma", 32, 4 * GIB, 6 * GIB)
    block = memory_block([m, text], measured_peak=7 * GIB)
    # every model's weights resident at once, plus the largest batch's activations (the VAE's 3.125 GiB)
    assert block["predicted_peak_bytes"] == 6 * GIB + 32 * 100 * 2 ** 20
    assert block["measured_peak_bytes"] == 7 * GIB and len(block["models"]) == 2


def test_a_text_encoder_on_its_own_stream_adds_its_activations_and_runs_there_only_where_that_fits():
    """Beside the VAE (its own CUDA stream) the text encoder's activations do not reuse the VAE's memory: the
    prediction adds them, and the stage runs it there only where weights and both peaks fit 90 % of the memory."""
    vae = ModelMemory("vae", "ltx2 @ 768x512x121", 1, 2 * GIB, 12 * GIB)  # 10 GiB of activations
    vae_small = ModelMemory("vae", "ltx2 @ 384x256x121", 1, 2 * GIB, 5 * GIB)  # (another bucket: 3 GiB)
    text = ModelMemory("text", "t5 (xxl)", 1, 9 * GIB, 10 * GIB)  # 1 GiB of activations
    models = [vae, vae_small, text]
    assert memory_block(models, None)["predicted_peak_bytes"] == 11 * GIB + 10 * GIB  # one stream: the larger
    block = memory_block(models, None, beside=("text",))
    assert block["predicted_peak_bytes"] == 11 * GIB + 10 * GIB + 1 * GIB and block["beside"] == ["text"]
    assert "beside" not in memory_block(models, None)
    assert text_fits_beside(models, 25 * GIB)  # 22 GiB <= 22.5
    assert not text_fits_beside(models, 24 * GIB)  # 22 GiB > 21.6
    assert not text_fits_beside([vae], 100 * GIB) and not text_fits_beside([text], 100 * GIB)  # both measured
    assert not text_fits_beside([ModelMemory("vae", "sd", 8, GIB, None), ModelMemory("text", "t5", 8, GIB, None)],
                                100 * GIB)  # (off a GPU: nothing measured)
    assert not text_fits_beside(models, None)  # no GPU
    # every resident model counts: an audio VAE's weights and activations leave less room beside
    audio = ModelMemory("audio", "ltx2_audio", 1, 3 * GIB, 4 * GIB)
    assert memory_block(models + [audio], None, beside=("text",))["predicted_peak_bytes"] == 25 * GIB
    assert not text_fits_beside(models + [audio], 25 * GIB) and text_fits_beside(models + [audio], 28 * GIB)


def test_weights_are_counted_as_stored_tied_once_and_quantised_smaller():
    lin = torch.nn.Linear(64, 32).to(torch.bfloat16)
    assert param_bytes(lin) == (64 * 32 + 32) * 2
    tied = torch.nn.Module()
    tied.a = torch.nn.Embedding(100, 16)
    tied.b = torch.nn.Linear(16, 100, bias=False)
    tied.b.weight = tied.a.weight
    assert param_bytes(tied) == 100 * 16 * 4
    pytest.importorskip("torchao")
    from shardsmith.encode.quantize import quantize_text
    from shardsmith.encode.text import load_text_encoder

    enc = load_text_encoder("gemma", config="tiny", dtype="bfloat16", device="cpu")
    full = param_bytes(enc.model)
    lin_elems = sum(m.weight.numel() for m in enc.model.modules() if isinstance(m, torch.nn.Linear))
    quantize_text(enc, "int8")
    q = param_bytes(enc.model)
    # each linear weight from 2 bytes to 1, plus a per-channel scale: never counted as nothing
    assert full - lin_elems < q < full - lin_elems // 2


@pytest.mark.slow
def test_scan_probe_models_prints_each_model_and_exits_2_without_a_recipe(tmp_path):
    src = tmp_path / "src"
    real_photos(src, 6, min_side=80, max_side=120)
    recipe = {"sources": [{"path": str(src)}], "geometry": {"buckets": ["64x64x1"]},
              "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}, "batch_size": 4, "device": "cpu"},
              "outputs": [{"format": "latent_wds"}]}
    (tmp_path / "r.json").write_text(json.dumps(recipe))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "shardsmith", "scan", "--recipe", str(tmp_path / "r.json"),
                        "--probe-models", "-q", "--json"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    probe = json.loads(r.stdout)["models_probe"]
    assert probe["device"] == "cpu" and [m["name"] for m in probe["models"]] == ["vae", "text"]
    vae, text = probe["models"]
    assert vae["what"] == "sd (tiny, random-weights) @ 64x64x1" and vae["batch"] == 4 and vae["peak_bytes"] is None
    assert vae["param_bytes"] > 0 and vae["items_per_s"] > 0 and text["param_bytes"] > 20 * 2 ** 20
    assert any(line.startswith("models: text minilm (pretrained)") for line in probe["lines"])
    bad = subprocess.run([sys.executable, "-m", "shardsmith", "scan", str(src), "--probe-models", "-q"],
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "--probe-models needs --recipe" in bad.stderr and "Traceback" not in bad.stderr


def test_the_build_summary_says_how_the_encoders_ran():
    """The last lines of a build name the device and batch, the compile decision and its reason, the JPEG
    decoder, the first batch, the steady-state rate and GPU idle, and the GPU's peak (from the manifest)."""
    from shardsmith.manifest import model_lines

    models = {"device": "cuda", "batch_size": 64,
              "compile": {"setting": "auto", "compiled": False, "reason": "auto: 400 items left ...: stay eager"},
              "image_decoder": "pil-draft",
              "steady_state": {"items_per_s": 745.94, "first_batch_done_s": 7.398, "gpu_idle": {"idle_frac": 0.0003}},
              "memory": {"measured_peak_bytes": 3 * GIB}}
    line, = model_lines(models)
    assert line == ("models: encoders on cuda, batch 64; compile off (auto: 400 items left ...: stay eager); JPEGs "
                    "decoded by pil-draft; first batch done 7.4 s after the outputs started; 745.9 items/s in the "
                    "steady state, GPU idle 0.0 %; GPU peak 3.00 GiB")
    assert model_lines(None) == [] and model_lines({"random_weights": []}) == []
    assert model_lines({"device": "cpu", "batch_size": 8}) == ["models: encoders on cpu, batch 8"]
    # a resume told to run otherwise than its build began says so
    off = {"setting": "off", "compiled": False, "reason": "off in the recipe (models.compile)",
           "note": "this build began compiled (auto: ...): the latents written before differ from these in their last bits"}
    assert model_lines({"device": "cuda", "batch_size": 8, "compile": off}) == [
        "models: encoders on cuda, batch 8; compile off (off in the recipe (models.compile)) (note: this build began "
        "compiled (auto: ...): the latents written before differ from these in their last bits)"]
