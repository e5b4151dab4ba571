"""A model's ``pretrained`` that is not there, ``--gpus`` beyond the machine's GPUs and buckets without a frame-1
bucket for image-only sources are one message and exit code 2, before anything is planned or any model library is
imported; a hub repo id that cannot be loaded is the same message, not the libraries' traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_cli_mistakes import assert_message, assert_refused, invoke

from shardsmith.errors import UserError
from shardsmith.recipe import recipe_from_dict

PY = sys.executable
PHOTOS = Path(__file__).resolve().parent.parent / "examples" / "quickstart" / "photos"
FIX = "point it at the model's folder"


def run(*args, cwd=None, **env) -> subprocess.CompletedProcess:
    """``shardsmith ARGS`` through the real console entry, with ``env`` added to the environment."""
    return subprocess.run([PY, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **env})


def planned_nothing(out: Path) -> None:
    """The refused build left no folder (nothing planned, no ledger)."""
    assert not out.exists(), sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))


def write(tmp: Path, recipe: dict) -> Path:
    p = tmp / "r.yaml"
    p.write_text(yaml.safe_dump(recipe))
    return p


def latent(vae: dict, **extra) -> dict:
    return {"sources": [{"path": str(PHOTOS)}], "geometry": {"buckets": ["64x64x1"]},
            "models": {"vae": vae, "device": "cpu"}, "outputs": [{"format": "latent_wds"}], **extra}


def precheck_of(data: dict) -> None:
    from shardsmith.precheck import precheck

    precheck(recipe_from_dict(data))


def refused_by_precheck(data: dict, *texts: str) -> str:
    with pytest.raises(UserError) as err:
        precheck_of(data)
    for t in texts:
        assert t in str(err.value), f"{t!r} not in {err.value}"
    return str(err.value)


def vae_folder(path: Path) -> Path:
    """A folder holding a VAE's config.json (no weights: enough for the checks before loading)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKL", "latent_channels": 4,
                                                  "block_out_channels": [8, 8]}))
    return path


# ---------------------------------------------------------------- pretrained: a local path that is not there

def test_a_missing_vae_folder_is_refused_before_the_plan_through_the_real_entry(tmp_path):
    out = tmp_path / "out"
    r = run("build", write(tmp_path, latent({"family": "sd", "pretrained": "/nonexistent/vae"})), "--out", out)
    assert_refused(r, "models.vae.pretrained: /nonexistent/vae does not exist", "read as a local folder", FIX,
                   "org/name", "leave pretrained out for random weights")
    planned_nothing(out)


@pytest.mark.parametrize("family", ["t5", "minilm"])
def test_a_missing_text_encoder_folder_is_refused(tmp_path, family):
    out = tmp_path / "out"
    data = {"sources": [{"path": str(PHOTOS)}], "models": {"text": {"family": family, "pretrained": "/nonexistent/t5"},
                                                           "device": "cpu"},
            "outputs": [{"format": "prompt_wds"}]}
    code, output = invoke("build", write(tmp_path, data), "--out", out)
    assert_message(code, output, "models.text.pretrained: /nonexistent/t5 does not exist", FIX)
    planned_nothing(out)


def test_a_missing_teacher_folder_is_refused_by_distill(tmp_path):
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": f"thing {i}"}) + "\n" for i in range(3)))
    data = {"sources": [{"path": str(tmp_path / "p.jsonl"), "columns": {"caption": "prompt"}}],
            "outputs": [{"format": "kd_wds"}],
            "models": {"teacher": {"family": "sana", "pretrained": str(tmp_path / "no_teacher"),
                                   "subfolder": "transformer"},
                       "text": {"family": "minilm"}, "device": "cpu"},
            "distill": {"shape": [4, 8, 8], "steps": 8}}
    out = tmp_path / "out"
    code, output = invoke("distill", write(tmp_path, data), "--out", out)
    assert_message(code, output, f"models.teacher.pretrained: {tmp_path / 'no_teacher'} does not exist", FIX)
    planned_nothing(out)


def test_scan_probe_models_refuses_a_missing_vae_folder(tmp_path):
    code, output = invoke("scan", "--recipe", write(tmp_path, latent({"family": "sd", "pretrained": "/nonexistent/vae"})),
                          "--probe-models")
    assert_message(code, output, "models.vae.pretrained: /nonexistent/vae does not exist")


def test_a_missing_audio_vae_folder_is_refused(tmp_path):
    data = latent({"family": "ltx", "config": "tiny"}, geometry={"buckets": ["64x64x9"]})
    data["models"]["audio_vae"] = {"pretrained": str(tmp_path / "gone"), "subfolder": "audio_vae"}
    data["models"]["text"] = {"family": "minilm"}
    data["outputs"] = [{"format": "precomputed"}]
    refused_by_precheck(data, f"models.audio_vae.pretrained: {tmp_path / 'gone'} does not exist", FIX)


@pytest.mark.parametrize("value, why", [("./no_such_vae", "starting with ./"), ("a/b/c", "not a hub repo id"),
                                        ("~/no_such_vae_xyz", "starting with ./, ../ or ~")])
def test_relative_and_tilde_paths_are_read_as_folders(tmp_path, monkeypatch, value, why):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    msg = refused_by_precheck(latent({"family": "sd", "pretrained": value}),
                              f"models.vae.pretrained: {value}", "does not exist", why)
    assert (f"({tmp_path / 'home' / 'no_such_vae_xyz'})" if value.startswith("~")
            else f"from the current directory, {tmp_path}") in msg


def test_a_missing_subfolder_of_an_existing_folder_is_named(tmp_path):
    vae_folder(tmp_path / "pipe" / "vae")
    refused_by_precheck(latent({"family": "sd", "pretrained": str(tmp_path / "pipe"), "subfolder": "vea"}),
                        "models.vae.subfolder", "has no folder 'vea'", "it holds vae/", "fix subfolder")


def test_a_pipeline_folder_without_subfolder_suggests_it(tmp_path):
    vae_folder(tmp_path / "pipe" / "vae")
    refused_by_precheck(latent({"family": "sd", "pretrained": str(tmp_path / "pipe")}),
                        "models.vae.pretrained", "has no config.json", "set models.vae.subfolder", "(vae)")


def test_a_file_as_pretrained_is_named(tmp_path):
    f = tmp_path / "vae.safetensors"
    f.write_bytes(b"x")
    refused_by_precheck(latent({"family": "sd", "pretrained": str(f)}), "is a file, not a folder")


def test_an_ltx2_text_folder_without_its_parts_is_named(tmp_path):
    (tmp_path / "ltx2" / "text_encoder").mkdir(parents=True)
    data = {"sources": [{"path": str(PHOTOS)}], "outputs": [{"format": "prompt_wds"}],
            "models": {"text": {"family": "ltx2", "pretrained": str(tmp_path / "ltx2")}, "device": "cpu"}}
    refused_by_precheck(data, "models.text.pretrained", "text_encoder/config.json", "diffusers LTX-2 folder")


def test_existing_folders_hub_ids_and_random_weights_pass(tmp_path, monkeypatch):
    vae_folder(tmp_path / "pipe" / "vae")
    precheck_of(latent({"family": "sd", "pretrained": str(tmp_path / "pipe"), "subfolder": "vae"}))
    precheck_of(latent({"family": "sd", "config": "tiny"}))  # random weights: nothing to find
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    precheck_of(latent({"family": "sd", "pretrained": "nobody/no-such-vae"}))  # a hub id: never asked here
    # a model the build does not load is not checked (a wds output loads no VAE)
    precheck_of({**latent({"family": "sd", "pretrained": "/nonexistent/vae"}), "outputs": [{"format": "wds"}]})


def test_looks_local_follows_the_hub_clients_repo_id_rule(tmp_path, monkeypatch):
    from shardsmith.precheck import local_path, looks_local

    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "vae").mkdir(parents=True)
    for local in ["/abs/vae", "./vae", "../vae", "~/vae", "~", ".", "a/b/c", "org/vae", "bad--name", "x..y", "C:\\m"]:
        assert looks_local(local), local
    for hub in ["stabilityai/sd-vae-ft-mse", "gpt2", "Org_1/name.v2", "nobody/no-such-vae"]:
        assert not looks_local(hub), hub
    monkeypatch.setenv("HOME", str(tmp_path))
    assert local_path("~/m") == str(tmp_path / "m") and local_path("org/m") == "org/m" and local_path(None) is None


# ---------------------------------------------------------------- a hub id that cannot be loaded

def _cache_with_config(root: Path, repo: str, sub: str = "vae") -> Path:
    """A Hugging Face cache holding only ``repo``'s ``sub/config.json`` (no weights)."""
    rev = "b" * 40
    d = root / ("models--" + repo.replace("/", "--"))
    vae_folder(d / "snapshots" / rev / sub)
    (d / "refs").mkdir()
    (d / "refs" / "main").write_text(rev)
    return root


def test_offline_a_hub_id_not_in_the_cache_is_said_as_the_load_starts(tmp_path, monkeypatch):
    from shardsmith.precheck import ModelLoadError, check_hub_cache

    monkeypatch.setenv("HF_HUB_CACHE", str(_cache_with_config(tmp_path / "cache", "acme/tiny-sd")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelLoadError, match=r"models\.vae\.pretrained: 'acme/not-cached' .* not in the local "
                                             r"Hugging Face cache while HF_HUB_OFFLINE is set.*hf download acme/not"):
        check_hub_cache(recipe_from_dict(latent({"family": "sd", "pretrained": "acme/not-cached"})))
    check_hub_cache(recipe_from_dict(latent({"family": "sd", "pretrained": "acme/tiny-sd", "subfolder": "vae"})))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    check_hub_cache(recipe_from_dict(latent({"family": "sd", "pretrained": "acme/not-cached"})))  # online: the load


@pytest.mark.slow
def test_an_offline_build_of_an_uncached_hub_id_is_exit_2_before_any_model_import(tmp_path):
    r = run("build", write(tmp_path, latent({"family": "sd", "pretrained": "madeup-org/no-such-vae-xyz"})),
            "--out", tmp_path / "out", HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "empty"))
    assert_refused(r, "models.vae.pretrained: 'madeup-org/no-such-vae-xyz'", "HF_HUB_OFFLINE",
                   "hf download madeup-org/no-such-vae-xyz", "point pretrained at a local folder")
    assert "Traceback" not in r.stderr  # was 6 s of imports, then OSError's traceback (exit 1)
    planned_nothing(tmp_path / "out")  # refused before the plan (was: every item planned, the ledger left)


def test_load_errors_turns_the_libraries_oserror_into_the_keys_message():
    from huggingface_hub.errors import HFValidationError

    from shardsmith.precheck import ModelLoadError, load_errors

    class M:
        pretrained, subfolder = "acme/vae", "vae"

    with pytest.raises(ModelLoadError, match=r"models\.vae\.pretrained: 'acme/vae' \(subfolder 'vae'\) could not be "
                                             r"loaded \(no config\.json\); it is read as a Hugging Face hub repo id"):
        with load_errors("vae", M()):
            raise OSError("no config.json\nmore lines")
    M.pretrained = "/models/vae"
    with pytest.raises(ModelLoadError, match=r"the folder '/models/vae' \(subfolder 'vae'\) could not be loaded"):
        with load_errors("vae", M()):
            raise HFValidationError("Repo id must be in the form 'repo_name'")
    with pytest.raises(ValueError, match="shape"):  # not a load error: as it is
        with load_errors("vae", M()):
            raise ValueError("shape")
    M.pretrained = None
    with pytest.raises(OSError):  # random weights: as it is
        with load_errors("vae", M()):
            raise OSError("x")


@pytest.mark.slow
def test_a_cached_config_without_weights_offline_is_exit_2_at_load(tmp_path):
    """The cache check passes (config.json is cached), the load itself fails offline: one message, exit 2."""
    cache = _cache_with_config(tmp_path / "cache", "acme/half-cached")
    r = run("build", write(tmp_path, latent({"family": "sd", "pretrained": "acme/half-cached", "subfolder": "vae"})),
            "--out", tmp_path / "out", HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache))
    assert_refused(r, "models.vae.pretrained: 'acme/half-cached' (subfolder 'vae') could not be loaded",
                   "Hugging Face hub repo id", "HF_HUB_OFFLINE is set", "hf download acme/half-cached")


@pytest.mark.slow
def test_a_tilde_pretrained_loads(tmp_path, monkeypatch):
    """``~/...`` is expanded for the load (diffusers would take it for a malformed repo id)."""
    from shardsmith.encode.stage import _load_vae
    from shardsmith.encode.vae import load_vae

    monkeypatch.setenv("HOME", str(tmp_path))
    load_vae("sd").model.save_pretrained(tmp_path / "m" / "vae")
    recipe = recipe_from_dict(latent({"family": "sd", "pretrained": "~/m", "subfolder": "vae"}))
    precheck_of(latent({"family": "sd", "pretrained": "~/m", "subfolder": "vae"}))
    enc = _load_vae(recipe, "cpu")
    assert enc.provenance.weights == "pretrained" and enc.provenance.path_or_repo == str(tmp_path / "m")
    # and everywhere else the recipe's pretrained is read: decode's check of the recorded weights, and the
    # memory estimate of models.offload: auto (each took ~/m for a missing folder or a malformed repo id)
    from shardsmith.encode.memory_estimate import estimate
    from shardsmith.verify.decode_audio import check_recorded_weights

    check_recorded_weights("models.vae", recipe.models.vae)
    assert estimate(recipe, "vae", 1).param_bytes == sum(p.numel() * 4 for p in enc.model.parameters())


# ---------------------------------------------------------------- --gpus beyond the machine

def test_gpus_without_models_is_refused_before_the_plan(tmp_path):
    out = tmp_path / "out"
    r = run("build", "--source", PHOTOS, "--to", "wds", "--gpus", "2", "--out", out, CUDA_VISIBLE_DEVICES="")
    assert_refused(r, "distribute.gpus (--gpus) is 2, but torch sees 0 CUDA device(s)",
                   "No output of this recipe loads a model (wds)", "leave --gpus out")
    planned_nothing(out)  # was: 6 items planned, then the refusal, and out/ left behind


def test_gpus_hook_and_one_gpu_pass(monkeypatch):
    data = {"sources": [{"path": str(PHOTOS)}], "outputs": [{"format": "wds"}]}
    precheck_of({**data, "distribute": {"gpus": 1}})
    monkeypatch.setenv("SHARDSMITH_WORKER_DEVICES", "cpu,cpu")  # the test hook stands for GPUs
    precheck_of({**data, "distribute": {"gpus": 2}})


def test_gpus_with_models_keeps_its_message(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch saw a GPU before CUDA_VISIBLE_DEVICES was cleared")
    msg = refused_by_precheck({**latent({"family": "sd"}), "distribute": {"gpus": 2}}, "distribute.gpus (--gpus) is 2")
    assert "No output" not in msg


# ---------------------------------------------------------------- buckets without a frame-1 bucket, images only

def test_video_buckets_for_image_sources_are_refused_before_the_plan(tmp_path):
    out = tmp_path / "out"
    data = latent({"family": "sd"}, geometry={"buckets": ["64x64x2"]})
    code, output = invoke("build", write(tmp_path, data), "--out", out)
    assert_message(code, output, "output 'latent_wds': every input it takes is an image",
                   "(64x64x2) has no bucket of 1 frame", "add one such as 512x512x1")
    planned_nothing(out)


def _media(folder: Path, *names: str) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        if n.endswith(".jpg"):
            Image.new("RGB", (8, 8)).save(folder / n)
        else:
            (folder / n).write_bytes(b"\0")
    return folder


def test_image_only_is_told_from_names_and_only_when_certain(tmp_path):
    def check(sources, buckets=("64x64x2",), out=None):
        data = {**latent({"family": "sd"}, geometry={"buckets": list(buckets)}), "sources": sources}
        if out:
            data["outputs"] = out
        return precheck_of(data)

    imgs = _media(tmp_path / "imgs", "a.jpg", "notes.md", ".hidden.mp4")
    _media(imgs / "sub", "b.jpg")
    with pytest.raises(UserError, match="every input it takes is an image"):
        check([{"path": str(imgs)}])
    check([{"path": str(imgs)}], buckets=("64x64x2", "64x64x1"))  # a frame-1 bucket: fine
    mixed = _media(tmp_path / "mixed", "a.jpg")
    _media(mixed / "clips", "c.mp4")  # a clip: images are skipped, the clip is encoded
    check([{"path": str(mixed)}])
    check([{"path": str(imgs), "name": "i"}, {"path": str(mixed), "name": "m"}])
    with pytest.raises(UserError, match="'only_imgs'"):  # an output of the image source alone
        check([{"path": str(imgs), "name": "i"}, {"path": str(mixed), "name": "m"}],
              out=[{"format": "latent_wds", "name": "only_imgs", "sources": ["i"]},
                   {"format": "latent_wds", "name": "all", "dir": "all"}])
    table = tmp_path / "t" / "t.csv"
    _media(table.parent, "a.jpg", "v.mp4")
    table.write_text("file,caption\na.jpg,x\na.jpg,y\n")
    with pytest.raises(UserError, match="every input it takes is an image"):
        check([{"path": str(table)}])
    table.write_text("file,caption\na.jpg,x\nv.mp4,y\n")
    check([{"path": str(table)}])
    check([{"path": str(tmp_path / "empty")}])  # (no such folder: the plan says so, as before)
