"""Command line: ``shardsmith build`` and ``shardsmith scan``.

Every recipe key has a flag: the common ones by name (``--source``, ``--to``,
``--resolution`` ...) and any other through ``--set key.path=value`` (YAML value). Flags
given with a recipe file override the file's values for the first source/output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
import yaml

from shardsmith.recipe import RecipeError, load_recipe, recipe_from_dict, set_key

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Compile raw media into training-ready datasets and prove they load.")


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _raw_recipe(recipe_path: Optional[Path], sources: list[str], flags: dict[str, Any], to: list[str],
                sets: list[str]) -> tuple[dict[str, Any], Path]:
    """Merge a recipe file (optional) with CLI flags into one raw dict; returns (dict, base dir)."""
    if recipe_path is not None:
        try:
            data = yaml.safe_load(recipe_path.read_text(encoding="utf-8")) or {}
        except FileNotFoundError:
            _fail(f"recipe file {recipe_path} does not exist")
        except yaml.YAMLError as exc:
            _fail(f"recipe {recipe_path} is not valid YAML: {exc}")
        base = recipe_path.parent
    else:
        data, base = {}, Path.cwd()
    if sources:
        data["sources"] = [{"path": s} for s in sources]
        base = Path.cwd()
    if to:
        data["outputs"] = [{"format": t} for t in to]
    src_keys = {"origin": "origin", "license": "license", "caption_errors": "caption_errors", "labels": "labels"}
    for flag, key in src_keys.items():
        if flags.get(flag) is not None:
            for s in data.setdefault("sources", [{}]):
                s[key] = flags[flag]
    if flags.get("columns"):
        cols = dict(kv.split("=", 1) for kv in flags["columns"].split(","))
        for s in data.setdefault("sources", [{}]):
            s["columns"] = cols
    for flag in ("holdout", "seed"):
        if flags.get(flag) is not None:
            data.setdefault("split", {})[flag] = flags[flag]
    if flags.get("no_dedup"):
        data.setdefault("split", {})["dedup"] = False
    for flag in ("min_size", "max_pixels"):
        if flags.get(flag) is not None:
            data.setdefault("images", {})[flag] = flags[flag]
    if flags.get("upscale"):
        data.setdefault("images", {})["upscale"] = True
    if flags.get("background"):
        data.setdefault("images", {})["background"] = [int(c) for c in flags["background"].split(",")]
    outs = data.get("outputs") or []
    for o in outs:
        if o.get("format") in ("wds", "latent_wds"):  # shard layout
            for flag, key in (("dir", "dir"), ("samples_per_shard", "samples_per_shard"),
                              ("max_shard_bytes", "max_shard_bytes")):
                if flags.get(flag) is not None:
                    o[key] = flags[flag]
        if o.get("format") == "wds":
            for flag, key in (("image_format", "format"), ("quality", "quality"), ("max_side", "max_side")):
                if flags.get(flag) is not None:
                    o.setdefault("image", {})[key] = flags[flag]
            if flags.get("passthrough"):
                o.setdefault("image", {})["passthrough"] = True
        elif o.get("format") == "zip":
            if flags.get("zip_path") is not None:
                o["path"] = flags["zip_path"]
            if flags.get("resolution") is not None:
                r = flags["resolution"]
                o["resolution"] = [int(x) for x in r.lower().split("x")] if "x" in r.lower() else int(r)
            if flags.get("transform") is not None:
                o["transform"] = flags["transform"]
    if flags.get("workers") is not None:
        data["workers"] = flags["workers"]
    if flags.get("one_sample"):
        data["one_sample"] = True
    for s in sets:
        if "=" not in s:
            _fail(f"--set {s!r}: expected key.path=value")
        k, v = s.split("=", 1)
        try:
            set_key(data, k.strip(), yaml.safe_load(v))
        except RecipeError as exc:
            _fail(str(exc))
    return data, base


_SRC_HELP = "A source: image folder (class sub-folders become labels) or table (.csv/.json/.jsonl/.parquet)."


def _recipe(recipe_path, source, flags, to, sets, origin):
    data, base = _raw_recipe(recipe_path, source or [], flags, to or [], sets or [])
    try:
        return recipe_from_dict(data, base_dir=base, origin=origin)
    except RecipeError as exc:
        _fail(str(exc))


@app.command()
def build(
    recipe_path: Optional[Path] = typer.Argument(None, metavar="[RECIPE.yaml]", help="Recipe file (YAML)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder (created; never overwritten without --overwrite)."),
    source: Optional[list[str]] = typer.Option(None, "--source", help=_SRC_HELP),
    to: Optional[list[str]] = typer.Option(None, "--to", help="Output format: wds or zip (repeatable)."),
    origin: Optional[str] = typer.Option(None, help="sources[*].origin"),
    license: Optional[str] = typer.Option(None, "--license", help="sources[*].license (declared by you)."),
    columns: Optional[str] = typer.Option(None, help="sources[*].columns, e.g. media=file,caption=text,label=cls"),
    labels: Optional[str] = typer.Option(None, help="sources[*].labels: auto | none"),
    caption_errors: Optional[str] = typer.Option(None, help="sources[*].caption_errors: fail | replace"),
    holdout: Optional[float] = typer.Option(None, help="split.holdout: fraction (<1) or count (>=1)."),
    seed: Optional[int] = typer.Option(None, help="split.seed"),
    no_dedup: bool = typer.Option(False, "--no-dedup", help="split.dedup=false: keep exact duplicates."),
    min_size: Optional[int] = typer.Option(None, help="images.min_size (shorter side, pixels)."),
    max_pixels: Optional[int] = typer.Option(None, help="images.max_pixels (decompression-bomb limit)."),
    upscale: bool = typer.Option(False, "--upscale", help="images.upscale=true"),
    background: Optional[str] = typer.Option(None, help="images.background as R,G,B"),
    dir: Optional[str] = typer.Option(None, "--dir", help="wds, latent_wds: outputs[*].dir"),
    samples_per_shard: Optional[int] = typer.Option(None, help="wds, latent_wds: samples_per_shard"),
    max_shard_bytes: Optional[int] = typer.Option(None, help="wds, latent_wds: max_shard_bytes"),
    image_format: Optional[str] = typer.Option(None, help="wds: image.format (jpg|png|webp)"),
    quality: Optional[int] = typer.Option(None, help="wds: image.quality"),
    max_side: Optional[int] = typer.Option(None, help="wds: image.max_side"),
    passthrough: bool = typer.Option(False, "--passthrough", help="wds: image.passthrough=true"),
    zip_path: Optional[str] = typer.Option(None, "--zip-path", help="zip output: outputs[*].path"),
    resolution: Optional[str] = typer.Option(None, help="zip: resolution, 64 or WxH"),
    transform: Optional[str] = typer.Option(None, help="zip: center-crop | center-crop-wide | center-crop-dhariwal"),
    workers: Optional[int] = typer.Option(None, help="workers: CPU processes (default: all cores, max 8)."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Any recipe key: --set outputs[0].image.quality=90"),
    one_sample: bool = typer.Option(False, "--one-sample", help="one_sample=true: only the first usable item, "
                                    "at full resolution (use its own --out, e.g. overfit/)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Rebuild beside the old output; swap in when complete."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars or summary."),
):
    """Build every output of a recipe (or of flags) into --out, resumably and fully accounted."""
    from shardsmith.build import InvariantError, OutputExistsError, build as run_build
    from shardsmith.sources.base import SourceError

    flags = dict(locals())
    if recipe_path is None and not source:
        _fail("give a RECIPE.yaml or at least one --source (and --to)")
    recipe = _recipe(recipe_path, source, flags, to, set_, str(recipe_path or "<command line>"))
    try:
        manifest = run_build(recipe, out, overwrite=overwrite, quiet=quiet, workers=workers)
    except (OutputExistsError, SourceError) as exc:
        _fail(str(exc))
    except InvariantError as exc:
        _fail(str(exc), code=3)
    c = manifest["counts"]
    if not quiet:
        typer.echo(f"done: {out} ({c['written']} of {c['inputs']} inputs written; see {out}/manifest.json)")


@app.command()
def scan(
    source: list[str] = typer.Argument(..., help=_SRC_HELP),
    recipe_path: Optional[Path] = typer.Option(None, "--recipe", help="Take split/images/outputs from this recipe."),
    to: Optional[list[str]] = typer.Option(None, "--to", help="Output spec to estimate the size of: wds or zip."),
    license: Optional[str] = typer.Option(None, "--license"),
    origin: Optional[str] = typer.Option(None),
    columns: Optional[str] = typer.Option(None),
    resolution: Optional[str] = typer.Option(None),
    transform: Optional[str] = typer.Option(None),
    image_format: Optional[str] = typer.Option(None),
    quality: Optional[int] = typer.Option(None),
    max_side: Optional[int] = typer.Option(None),
    holdout: Optional[float] = typer.Option(None),
    seed: Optional[int] = typer.Option(None),
    min_size: Optional[int] = typer.Option(None),
    batch: Optional[int] = typer.Option(None, help="Training batch size (for the repetition estimate)."),
    updates: Optional[int] = typer.Option(None, help="Planned optimizer updates."),
    max_repeat: float = typer.Option(20.0, help="Warn when each sample would be seen more often than this."),
    set_: Optional[list[str]] = typer.Option(None, "--set"),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable report on stdout."),
):
    """Probe sources without writing a dataset: kinds, sizes, problems, duplicates, licences, output size."""
    from shardsmith.scan import format_scan, scan as run_scan
    from shardsmith.sources.base import SourceError

    flags = dict(locals())
    to = to or ([] if recipe_path else ["wds"])
    data, base = _raw_recipe(recipe_path, source, flags, to, set_ or [])
    if any(o.get("format") == "zip" and "resolution" not in o for o in data.get("outputs", [])):
        for o in data["outputs"]:
            o.setdefault("resolution", 64) if o.get("format") == "zip" else None
    try:
        recipe = recipe_from_dict(data, base_dir=base, origin="<scan>")
        result = run_scan(recipe, batch=batch, updates=updates, max_repeat=max_repeat)
    except RecipeError as exc:
        _fail(str(exc))
    except SourceError as exc:
        _fail(str(exc))
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    else:
        typer.echo(format_scan(result))


def main() -> None:  # pragma: no cover - console entry
    app()


def _key_map(text: Optional[str]) -> Optional[dict[str, str]]:
    if not text:
        return None
    try:
        return dict(kv.split("=", 1) for kv in text.split(","))
    except ValueError:
        _fail(f"--key-map {text!r}: expected key=suffix,key=suffix (e.g. real=latent.pth,condition=txt_emb.pth)")


@app.command()
def verify(
    dataset: Path = typer.Argument(..., help="A WebDataset folder (*.tar) or an EDM .zip."),
    preset: Optional[str] = typer.Option(None, help="Loader preset: image, image_latent, kd_pair, class_zip, ..."),
    key_map: Optional[str] = typer.Option(None, "--key-map", help="real=jpg,condition=txt (default: inferred)"),
    world: int = typer.Option(2, help="Simulated ranks (real processes)."),
    workers: int = typer.Option(2, help="DataLoader workers per rank."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size",
                                             help="Default: the preset's batch size (8 without a preset)."),
    batches: Optional[int] = typer.Option(None, help="Stop each rank after this many batches (no coverage check)."),
    image_size: Optional[int] = typer.Option(None, help="Decode images to float CHW at this size."),
    contract_in: str = typer.Option("auto", "--contract-in",
                                    help="auto (default): workers with 4+ workers per rank, else rank. "
                                         "workers: batches cross to their rank process as in "
                                         "training; the workers record the value statistics, the rank checks "
                                         "every batch's keys, dtypes and shapes and re-reads 1 in 16 in full. "
                                         "rank: the rank records everything (slowest). workers-only: the "
                                         "workers send only ids and statistics."),
    as_json: bool = typer.Option(False, "--json"),
    out_json: Optional[Path] = typer.Option(None, "--out-json", help="Also write the report here."),
):
    """Iterate the real loader over ranks x workers; check coverage, counts, splits and the batch contract."""
    from shardsmith.verify.runner import format_verify, verify as run_verify

    try:
        rep = run_verify(dataset, preset=preset, key_map=_key_map(key_map), world=world, workers=workers,
                         batch_size=batch_size, batches=batches, image_size=image_size, contract_in=contract_in)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        _fail(str(exc).strip("'\""))
    text = json.dumps(rep, indent=2, default=str, ensure_ascii=False)
    if out_json:
        out_json.write_text(text + "\n", encoding="utf-8")
    typer.echo(text if as_json else format_verify(rep))
    raise typer.Exit(0 if rep["ok"] else 1)


@app.command()
def inspect(
    dataset: Path = typer.Argument(..., help="A WebDataset folder."),
    key_map: Optional[str] = typer.Option(None, "--key-map"),
    world: int = typer.Option(1, help="For the empty-batch diagnosis."),
    workers: int = typer.Option(1, help="For the empty-batch diagnosis."),
    as_json: bool = typer.Option(False, "--json"),
):
    """Per shard: members by suffix, missing members, dotted keys, non-adjacent members, truncation, counts."""
    from shardsmith.verify.inspect import diagnose_empty, format_inspect, inspect_wds

    if not dataset.is_dir():
        _fail(f"{dataset} is not a folder of .tar shards")
    rep = inspect_wds(dataset, _key_map(key_map))
    rep["diagnosis"] = diagnose_empty(rep, world, workers)
    if as_json:
        typer.echo(json.dumps(rep, indent=2, default=str, ensure_ascii=False))
    else:
        typer.echo(format_inspect(rep))
        d = rep["diagnosis"]
        typer.echo(f"empty/short batches checklist: {d['verdict']}: {d['explanation']}")
    raise typer.Exit(0 if rep["ok"] else 1)


@app.command()
def repair(
    dataset: Path = typer.Argument(..., help="A WebDataset folder."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Report what would change; write nothing."),
    as_json: bool = typer.Option(False, "--json"),
):
    """Rewrite truncated shards from intact samples (originals kept), ignore corrupt samples, rebuild counts."""
    from shardsmith.verify.repair import RepairError, format_repair, repair_wds

    try:
        rep = repair_wds(dataset, dry_run=dry_run)
    except RepairError as exc:
        _fail(str(exc))
    typer.echo(json.dumps(rep, indent=2, default=str, ensure_ascii=False) if as_json else format_repair(rep))
    raise typer.Exit(1 if rep.get("errors") else 0)


@app.command()
def register(
    dataset: Path = typer.Argument(..., help="A WebDataset folder or an EDM .zip."),
    preset: str = typer.Option(..., help="Loader preset (see shardsmith.loaders.LOADER_PRESETS)."),
    name: str = typer.Option(..., help="Name of the entry in the data config."),
    config: Optional[Path] = typer.Option(None, help="Data-config YAML (default $SHARDSMITH_DATA_CONFIG or "
                                                      "~/.config/shardsmith/data.yaml)."),
    root_env: str = typer.Option("DATA_ROOT_DIR", help="Environment variable that holds the data root."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Loader override, e.g. --set batch_size=16"),
    replace: bool = typer.Option(False, "--replace", help="Replace an existing, different entry of that name."),
):
    """Add DATASET to a data-config file under NAME and print the FastGen preset override to paste."""
    from shardsmith.loaders.fastgen import fastgen_snippet
    from shardsmith.loaders.presets import get_preset, preset_config
    from shardsmith.loaders.registry import RegistryError, add_entry, config_path, portable_path

    try:
        p = get_preset(preset)
        overrides = {}
        for s in set_ or []:
            k, _, v = s.partition("=")
            overrides[k.strip()] = yaml.safe_load(v)
        preset_config(preset, dataset, **overrides)  # validates the overrides now, not at training time
        path, root = portable_path(dataset, root_env)
        entry = {"preset": preset, "path": path, **({"overrides": overrides} if overrides else {})}
        cfg_file = config_path(config)
        add_entry(cfg_file, name, entry, replace=replace)
    except (KeyError, RegistryError, ValueError) as exc:
        _fail(str(exc).strip("'\""))
    typer.echo(f"registered {name!r} in {cfg_file}: preset {preset}, path {path}")
    import os

    if root_env not in os.environ:
        typer.echo(f"note: ${root_env} is not set; export {root_env}={root} before loading it")
    typer.echo(f"\n# Python: from shardsmith.loaders import from_config; loader = from_config({name!r})")
    typer.echo("# FastGen (configs/data.py) override to paste:")
    typer.echo(fastgen_snippet(name, p, path, dataset, root_env, overrides))


@app.command("decode")
def decode_cmd(
    build_dir: Path = typer.Argument(..., help="A shardsmith build folder (the --out of a build with latents)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for the decoded PNG/MP4 files and the report."),
    output: Optional[str] = typer.Option(None, help="Which latent output (default: the first)."),
    split: str = typer.Option("train"),
    limit: Optional[int] = typer.Option(None, help="Decode at most this many samples."),
):
    """Decode cached latents back to PNG/MP4 with the recorded VAE; report round-trip PSNR."""
    from shardsmith.verify.decode import decode

    try:
        rep = decode(build_dir, out, output=output, split=split, limit=limit)
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
    typer.echo(f"decoded {rep['samples']} sample(s) of {rep['output']}/{rep['split']} into {out}; "
               f"mean round-trip PSNR {rep['mean_psnr_db']} dB")
    if rep["note"]:
        typer.echo(f"note: {rep['note']}")
