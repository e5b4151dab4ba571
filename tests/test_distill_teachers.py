"""The diffusers teachers of ``shardsmith distill`` (issue 19): a Stable-Diffusion-style UNet (epsilon or v
prediction on a VP schedule) sampled as EDM's denoiser, and the UNet family end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from shardsmith.encode.teacher import SD_SCHEDULE, sigma_to_t, vp_denoiser, vp_sigmas


def _exact_model(kind: str, mu: float):
    """A VP model that knows the data is the constant ``mu``: its exact epsilon (or v) at any timestep."""
    sig = vp_sigmas(SD_SCHEDULE)

    def model(xvp, t, cond, mask):
        lo = int(math.floor(t))
        hi, w = min(lo + 1, len(sig) - 1), t - lo
        s = torch.exp(sig[lo].log() * (1 - w) + sig[hi].log() * w)  # the sigma of fractional timestep t
        a = 1 / (1 + s ** 2)
        eps = (xvp - a.sqrt() * mu) / (1 - a).sqrt()
        return eps if kind == "epsilon" else a.sqrt() * eps - (1 - a).sqrt() * mu
    return model


@pytest.mark.parametrize("kind", ["epsilon", "v_prediction"])
def test_a_vp_model_becomes_the_exact_edm_denoiser(kind):
    mu = 0.7
    denoise = vp_denoiser(_exact_model(kind, mu), {**SD_SCHEDULE, "prediction_type": kind})
    g = torch.Generator().manual_seed(0)
    for sigma in (0.03, 0.2, 1.0, 3.7, 14.0):
        x = mu + sigma * torch.randn(2, 4, 8, 8, generator=g, dtype=torch.float64)
        assert float((denoise(x, sigma, None) - mu).abs().max()) < 1e-9, sigma


def test_the_sd_schedule_and_the_timestep_of_a_noise_level():
    sig = vp_sigmas(SD_SCHEDULE)
    assert len(sig) == 1000 and bool((sig[1:] > sig[:-1]).all())
    assert abs(float(sig[0]) - 0.02917) < 1e-4 and abs(float(sig[-1]) - 14.6146) < 1e-3  # SD's sigma range
    for i in (0, 1, 499, 998, 999):
        assert abs(sigma_to_t(float(sig[i]), sig) - i) < 1e-9
    mid = math.exp((math.log(float(sig[10])) + math.log(float(sig[11]))) / 2)
    assert abs(sigma_to_t(mid, sig) - 10.5) < 1e-9  # linear in log sigma between training levels
    assert sigma_to_t(100.0, sig) == 999 and sigma_to_t(1e-4, sig) == 0  # clamped to the schedule


@pytest.mark.slow
def test_a_unet_teacher_with_random_weights_samples_as_edm(tmp_path):
    from test_distill_build import PROMPTS, _distill, _load, _samples

    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:5]))
    t_list = [14.6, 3.0, 1.0, 0.3, 0.0]
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "sources": [{"path": "p.jsonl", "columns": {"caption": "prompt"}}],
        "models": {"teacher": {"family": "unet", "config": "tiny"}, "text": {"family": "minilm"}, "device": "cpu"},
        "distill": {"shape": [4, 8, 8], "steps": 8, "t_list": t_list, "guidance": 3.0},
        "outputs": [{"format": "kd_wds", "samples_per_shard": 4}]}))
    r = _distill(recipe, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    idx = json.loads((tmp_path / "out" / "kd" / "index.json").read_text())
    assert idx["parameterisation"] == "edm" and idx["rho"] == 7.0 and idx["path_timesteps"] == t_list[:-1]
    prov = idx["teacher"]["provenance"]
    assert prov["cls"] == "UNet2DConditionModel" and prov["weights"] == "random-weights"
    assert any("Stable Diffusion's DDPM schedule" in n for n in prov["notes"])
    samples = _samples(tmp_path / "out" / "kd")
    assert len(samples) == 5
    for m in samples.values():
        noise, path, latent = _load(m["noise.pth"]), _load(m["path.pth"]), _load(m["latent.pth"])
        assert torch.equal(path[0], noise * 14.6) and path.shape == (4, 4, 8, 8)
        assert torch.isfinite(latent).all() and not torch.equal(latent, path[-1])
