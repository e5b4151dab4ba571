"""Audit B findings 5, 6, 7, 9, 16 and 17: ``decode`` and ``distill`` on a damaged build or a nonsense
flag end in one ``error:`` line and exit code 2, before any model loads; ``decode`` of a correct
``.precomputed/`` image build decodes it."""

from __future__ import annotations

import json
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import yaml

from test_cli_mistakes import assert_message, invoke, run
from test_distill_mistakes import _recipe as distill_recipe

RECIPE = {"sources": [{"path": "/nonexistent/src"}], "geometry": {"buckets": ["64x64x1"]},
          "images": {"upscale": True},
          "models": {"vae": {"family": "sd", "config": "tiny"}, "text": {"family": "minilm"}, "device": "cpu"},
          "outputs": [{"format": "precomputed", "latent_dtype": "float32"},
                      {"format": "latent_wds", "dir": "latents"}]}


def hand_build(root: Path, *, pretrained: str | None = None, latents: bool = True) -> Path:
    """A build folder as an image build with a ``.precomputed/`` and a ``latent_wds`` output leaves it (the
    manifest's parts decode reads, one ``[C, F=1, H, W]`` latent in the tree; the shard is only named)."""
    recipe = json.loads(json.dumps(RECIPE))
    if pretrained is not None:
        recipe["models"]["vae"]["pretrained"] = pretrained
    prov = {"weights": "pretrained" if pretrained else "random-weights", "path_or_repo": pretrained}
    root.mkdir(parents=True)
    (root / "manifest.json").write_text(json.dumps({
        "recipe": recipe,
        "models": {"vae": {"spec": {"kind": "image_vae"}, "provenance": prov}},
        "outputs": {
            "precomputed": {"format": "precomputed", "files": {"train": {"dir": ".precomputed",
                                                                          "files": {"latents": 1, "conditions": 1}}}},
            "latent_wds": {"format": "latent_wds",
                           "files": {"train": {"dir": "latents", "shards": [{"name": "00000.tar", "count": 1}]}}}}}))
    if latents:
        (root / ".precomputed" / "latents").mkdir(parents=True)
        torch.save({"latents": torch.randn(4, 1, 8, 8), "num_frames": 1, "height": 8, "width": 8, "fps": 1.0},
                   root / ".precomputed" / "latents" / "a.pt")
    return root


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading a VAE fails the test: the refusal must come first."""
    def refuse(*a, **k):
        raise AssertionError("the VAE was loaded before the refusal")

    monkeypatch.setattr("shardsmith.verify.decode.load_vae", refuse)


# ---------------------------------------------------------------- 5: .precomputed/ image latents [C, 1, H, W]

@pytest.mark.slow
def test_decode_of_a_precomputed_image_tree_drops_the_frame_axis(tmp_path):
    build = hand_build(tmp_path / "b")
    code, output = invoke("decode", build, "--out", tmp_path / "dec", "--device", "cpu", "-q")
    assert code == 0, output
    rep = json.loads((tmp_path / "dec" / "decode_report.json").read_text())
    assert rep["output"] == "precomputed" and rep["samples"] == 1
    assert rep["rows"][0]["file"] == "a.png" and rep["rows"][0]["shape"] == [1, 64, 64, 3]


def test_image_latents_with_several_frames_are_refused_by_name():
    from types import SimpleNamespace

    from shardsmith.verify.decode import DecodeError, _for_vae

    vae = SimpleNamespace(spec=SimpleNamespace(kind="image_vae", family="sd"))
    assert _for_vae(torch.zeros(4, 1, 8, 8), vae, "a.pt").shape == (4, 8, 8)
    assert _for_vae(torch.zeros(4, 8, 8), vae, "a.pt").shape == (4, 8, 8)
    with pytest.raises(DecodeError, match="a.pt: latents of shape"):
        _for_vae(torch.zeros(4, 3, 8, 8), vae, "a.pt")
    video = SimpleNamespace(spec=SimpleNamespace(kind="video_vae", family="ltx"))
    assert _for_vae(torch.zeros(128, 1, 8, 8), video, "a.pt").shape == (128, 1, 8, 8)


@pytest.mark.slow
def test_plain_decode_of_a_real_precomputed_image_build_matches_its_latent_wds(tmp_path):
    """The audit's case end to end: a real build, ``decode OUT --out DIR`` (first output: precomputed)."""
    from media_factory import real_photos

    real_photos(tmp_path / "p", 2, seed=5, min_side=40, max_side=90)
    recipe = json.loads(json.dumps(RECIPE))
    recipe["sources"] = [{"path": str(tmp_path / "p")}]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    r = run("build", tmp_path / "r.yaml", "--out", tmp_path / "o", "-q")
    assert r.returncode == 0, r.stderr
    r = run("decode", tmp_path / "o", "--out", tmp_path / "d1", "--limit", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    r = run("decode", tmp_path / "o", "--out", tmp_path / "d2", "--output", "latent_wds")
    assert r.returncode == 0, r.stdout + r.stderr
    (row,) = json.loads((tmp_path / "d1" / "decode_report.json").read_text())["rows"]
    assert (tmp_path / "d1" / row["file"]).read_bytes() == (tmp_path / "d2" / row["file"]).read_bytes()
    assert row["psnr_db"] == {x["path"]: x for x in json.loads(
        (tmp_path / "d2" / "decode_report.json").read_text())["rows"]}[row["path"]]["psnr_db"]


# ---------------------------------------------------------------- 6: a distill build holds no latent output

@pytest.mark.parametrize("extra", [[], ["--output", "kd_wds"]])
def test_decode_of_a_distill_build_names_what_it_holds(tmp_path, extra, no_model_load):
    build = tmp_path / "dist"
    build.mkdir()
    (build / "manifest.json").write_text(json.dumps({
        "models": {"text": {"provenance": {"weights": "pretrained"}}},
        "outputs": {"kd_wds": {"format": "kd_wds", "files": {"train": {"dir": "kd", "shards": []}}}}}))
    code, output = invoke("decode", build, "--out", tmp_path / "dec", *extra)
    assert_message(code, output, "holds no latent output", "kd_wds (kd_wds)", "precomputed or latent_wds")
    assert not (tmp_path / "dec").exists()


# ---------------------------------------------------------------- 7: the recorded weights are gone

def test_decode_with_the_recorded_vae_folder_gone_names_it_and_loads_nothing(tmp_path, no_model_load, monkeypatch):
    import huggingface_hub

    def no_network(*a, **k):
        if not k.get("local_files_only"):
            raise AssertionError("decode tried the Hugging Face Hub")
        raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    gone = tmp_path / "gone_vae"
    build = hand_build(tmp_path / "b", pretrained=str(gone))
    code, output = invoke("decode", build, "--out", tmp_path / "dec")
    assert_message(code, output, f"models.vae.pretrained {gone}", "is not there", "put the model folder back")
    assert not (tmp_path / "dec").exists()


def test_decode_with_a_hub_vae_not_in_the_cache_says_it_never_downloads(tmp_path, no_model_load, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    build = hand_build(tmp_path / "b", pretrained="no-such-org-xyz/no-such-vae")
    code, output = invoke("decode", build, "--out", tmp_path / "dec")
    assert_message(code, output, "models.vae.pretrained no-such-org-xyz/no-such-vae", "Hugging Face cache",
                   "never downloads", "huggingface-cli download no-such-org-xyz/no-such-vae")


def test_decode_with_the_recorded_subfolder_gone_names_it(tmp_path, no_model_load):
    (tmp_path / "model").mkdir()
    build = hand_build(tmp_path / "b", pretrained=str(tmp_path / "model"))
    m = json.loads((build / "manifest.json").read_text())
    m["recipe"]["models"]["vae"]["subfolder"] = "vae"
    (build / "manifest.json").write_text(json.dumps(m))
    code, output = invoke("decode", build, "--out", tmp_path / "dec")
    assert_message(code, output, "models.vae.subfolder vae", "has no vae/ folder")


# ---------------------------------------------------------------- 9: the latent files are gone

def test_decode_with_the_latent_shards_gone_is_refused_before_the_vae_loads(tmp_path, no_model_load):
    build = hand_build(tmp_path / "b")
    (build / "latents").mkdir()  # the folder is there, the recorded shard is not
    code, output = invoke("decode", build, "--out", tmp_path / "dec", "--output", "latent_wds")
    assert_message(code, output, "output latent_wds", str(build / "latents" / "00000.tar"),
                   "recorded in the manifest) is missing")
    assert not (tmp_path / "dec").exists()


def test_decode_with_the_latent_folder_gone_is_refused(tmp_path, no_model_load):
    build = hand_build(tmp_path / "b")
    code, output = invoke("decode", build, "--out", tmp_path / "dec", "--output", "latent_wds")
    assert_message(code, output, "output latent_wds", str(build / "latents"), "is missing")


def test_decode_of_a_precomputed_tree_without_its_latents_is_refused_not_zero_samples(tmp_path, no_model_load):
    build = hand_build(tmp_path / "b", latents=False)
    (build / ".precomputed").mkdir()
    code, output = invoke("decode", build, "--out", tmp_path / "dec", "--output", "precomputed")
    assert_message(code, output, "output precomputed", str(build / ".precomputed" / "latents"), "is missing")
    assert "decoded 0" not in output
    (build / ".precomputed" / "latents").mkdir()  # there, but empty
    code, output = invoke("decode", build, "--out", tmp_path / "dec", "--output", "precomputed")
    assert_message(code, output, "holds 0 of the 1 latent files", "shardsmith verify")


# ---------------------------------------------------------------- 16, 17: distill's numbers

@contextmanager
def deadline(seconds: float):
    """Fail (rather than hang and fill memory) when the body runs longer than ``seconds``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(*_):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("guidance", ["inf", "1e300", "5000"])
def test_distill_refuses_a_non_finite_or_huge_guidance(tmp_path, guidance):
    recipe = distill_recipe(tmp_path)
    code, output = invoke("distill", recipe, "--out", tmp_path / "out", "--guidance", guidance)
    assert_message(code, output, "distill.guidance", "--guidance", "finite number from 0 to 1000")
    assert not (tmp_path / "out").exists()


def test_a_kd_recipe_built_with_an_infinite_guidance_is_refused_too(tmp_path):
    recipe = distill_recipe(tmp_path, distill={"guidance": float("inf")})
    code, output = invoke("build", recipe, "--out", tmp_path / "out")
    assert_message(code, output, "distill.guidance inf", "finite number")
    assert not (tmp_path / "out").exists()


def test_distill_refuses_an_absurd_steps_at_once(tmp_path):
    recipe = distill_recipe(tmp_path)
    with deadline(2):
        code, output = invoke("distill", recipe, "--out", tmp_path / "out", "--steps", "100000000000")
    assert_message(code, output, "distill.steps", "steps 100000000000 is more than 10000", "set steps <= 10000")
    assert not (tmp_path / "out").exists()


def test_time_grid_checks_steps_before_building_the_grid():
    from shardsmith.distill.schedule import MAX_STEPS, time_grid

    assert len(time_grid(MAX_STEPS, [0.999, 0.5, 0.0])[0]) == MAX_STEPS + 1
    with deadline(2), pytest.raises(ValueError, match=f"more than {MAX_STEPS}"):
        time_grid(10 ** 11, [0.999, 0.5, 0.0])


# ---------------------------------------------------------------- two decodes into one --out

def test_a_second_decode_into_the_same_out_is_refused_at_once_naming_the_first(tmp_path, no_model_load):
    from shardsmith.safety.lock import hold

    build = hand_build(tmp_path / "b")
    with hold(tmp_path / "dec", "decode"):
        code, output = invoke("decode", build, "--out", tmp_path / "dec", "--output", "precomputed")
    assert_message(code, output, str(tmp_path / "dec"), "is in use by another shardsmith process", "decode")


def test_the_decode_lock_is_not_a_foreign_file_for_the_next_decode(tmp_path):
    build = hand_build(tmp_path / "b")
    code, output = invoke("decode", build, "--out", tmp_path / "dec", "--output", "precomputed", "--device", "cpu")
    assert code == 0, output
    assert (tmp_path / "dec" / ".shardsmith" / "lock").is_file()
    code, output = invoke("decode", build, "--out", tmp_path / "dec", "--output", "precomputed", "--device", "cpu")
    assert_message(code, output, "holds an earlier decode", "pass --overwrite")
    code, output = invoke("decode", build, "--out", tmp_path / "dec", "--output", "precomputed", "--device", "cpu",
                          "--overwrite")
    assert code == 0, output
