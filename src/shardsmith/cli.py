"""Command line: ``shardsmith build``, ``scan``, ``verify``, ``inspect``, ``repair``, ``register``,
``decode``, ``report``.

Every recipe key has a flag: the common ones by name (``--source``, ``--to``,
``--resolution`` ...) and any other through ``--set key.path=value`` (YAML value). Flags
given with a recipe file override the file's values for the first source/output.

Every command is registered with :func:`command`: an error the user can cause and fix
(:class:`~shardsmith.errors.UserError`, raised where the mistake is found) ends as one
``error: <message>`` line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional

import typer
import yaml
from typer._click import exceptions as click_errors  # typer 0.29 ships its own click (pinned)
from typer.core import TyperGroup

from shardsmith import process_exit
from shardsmith.errors import UserError
from shardsmith.encode import diffusers_import
from shardsmith.import_notices import quiet_import_notices
from shardsmith.recipe import recipe_from_dict, set_key
from shardsmith.user_paths import check_no_loop, check_writable, nearest_folder, resolve_user_path, user_path_exists

quiet_import_notices()  # before any model library is imported
diffusers_import.allow()  # a command: a VAE-only build imports diffusers without transformers

class _OneLineErrors(TyperGroup):
    """Click's own usage errors (a flag value of the wrong type, an unknown option, a missing argument) end
    as one ``error:`` line naming the command's ``--help``, with click's exit code (2), like every other
    mistake, instead of a boxed panel; help (``--help``, no arguments) is shown as before."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except click_errors.NoArgsIsHelpError as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click_errors.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "shardsmith"
            typer.echo(f"error: {exc.format_message()} (see: {where} --help)", err=True)
            sys.exit(exc.exit_code)
        except click_errors.ClickException as exc:
            typer.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except typer.Abort:  # (typer's, from an end of input; its click module has none; Ctrl-C is exit 130)
            typer.echo("Aborted.", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)  # (a command's typer.Exit(code) comes back as its code)


app = typer.Typer(cls=_OneLineErrors, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Compile raw media into training-ready datasets and prove they load.")


#: the exit code of a build that ran to its end and holds no sample (every input failed or was skipped): the
#: code of the audio gate's "the run lost all its audio" (:class:`~shardsmith.safety.audio.AudioGateError`), never 0
NOTHING_WRITTEN_EXIT = 3


class UsageError(UserError):
    """A flag or argument the command cannot take."""


def _fail(msg: str) -> NoReturn:
    raise UsageError(msg)


def _exit(msg: str, code: int) -> NoReturn:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _user_errors(fn: Callable, also: tuple[type[BaseException], ...]) -> Callable:
    """``fn`` with every :class:`UserError` (and every exception of ``also``: the user errors of an
    API that raises plain ones) ended as one message and its exit code, never a traceback."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            _check_path_args(kwargs)
            return fn(*args, **kwargs)
        except UserError as exc:
            _exit(str(exc), exc.exit_code)
        except also as exc:  # a KeyError's str() is the repr of its message
            _exit(_pydantic_message(exc) or (str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)),
                  UserError.exit_code)
    return run


def _check_path_args(kwargs: dict[str, Any]) -> None:
    """Refuse a symlink loop among the command's path arguments (every ``Path`` option or argument and
    every ``--source``) at once, naming the flag, before any work (:mod:`shardsmith.user_paths`)."""
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    params = {p.name: p for p in ctx.command.params} if ctx is not None else {}
    for key, value in kwargs.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        param = params.get(key)
        flag = param.opts[0] if param is not None and param.param_type_name == "option" and param.opts else None
        for v in values:
            if isinstance(v, Path) or (key == "source" and isinstance(v, str)):
                check_no_loop(v, flag)


def _pydantic_message(exc: BaseException) -> str | None:
    """A pydantic ``ValidationError`` (a loader config built from flags and ``--set``) as one line per error,
    ``<model>.<key>: <what is wrong>``, without pydantic's links; None for any other exception."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return None
    parts = []
    for e in exc.errors():
        key = ".".join(str(p) for p in e["loc"]) or "?"
        msg = "not a setting of it (a --set key or flag it does not have)" if e["type"] == "extra_forbidden" \
            else e["msg"]
        parts.append(f"{exc.title}.{key}: {msg}")
    return "; ".join(parts)


def command(name: Optional[str] = None, *, also: tuple[type[BaseException], ...] = ()) -> Callable:
    """Register a command of ``app`` whose user errors end as one message (see :func:`_user_errors`)."""
    def register(fn: Callable) -> Callable:
        return app.command(name)(_user_errors(fn, also))
    return register


def _table_hint(path: Path) -> str:
    return (f"{path} is a dataset table (rows of media and captions), not a recipe; pass it as a source: "
            f"shardsmith build --source {path} --to wds --out OUT (or --to zip / latent_wds / precomputed), "
            "or write a recipe whose sources: [{path: " + str(path) + "}]")


def _read_recipe_file(path: Path) -> dict[str, Any]:
    """The raw recipe mapping of a YAML file, or a :class:`UsageError` saying what the file is instead."""
    from shardsmith.recipe import Recipe
    from shardsmith.sources.base import TABLE_EXTENSIONS

    is_table = path.suffix.lower().lstrip(".") in TABLE_EXTENSIONS
    if path.is_dir():
        _fail(f"{path} is a folder, not a recipe file; to build from a folder of media: "
              f"shardsmith build --source {path} --to wds --out OUT")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        _fail(f"recipe file {path} does not exist")
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        _fail(_table_hint(path) if is_table else f"recipe {path} is not valid YAML: {exc}")
    if isinstance(data, dict) and (not is_table or set(data) & set(Recipe.model_fields)):
        return data
    if is_table:
        _fail(_table_hint(path))
    _fail(f"recipe {path} must be a mapping with sources: and outputs: (key: value lines, e.g. "
          f"sources: [{{path: photos}}]), not a {type(data).__name__}")


def _pairs(flag: str, text: str, example: str) -> dict[str, str]:
    """``a=b,c=d`` -> ``{"a": "b", "c": "d"}``, or a :class:`UsageError` naming the flag."""
    pairs = [kv.split("=", 1) for kv in text.split(",")]
    if any(len(kv) != 2 or not kv[0] for kv in pairs):
        _fail(f"{flag} {text!r}: expected key=value,key=value (e.g. {example})")
    return dict(pairs)


def _ints(flag: str, text: str, sep: str, expected: str) -> list[int]:
    """``text`` split at ``sep`` into integers, or a :class:`UsageError` saying what was ``expected``."""
    try:
        return [int(x) for x in text.lower().split(sep)]
    except ValueError:
        _fail(f"{flag} {text!r}: expected {expected}")


def _setting(flag: str, text: str) -> tuple[str, Any]:
    """``key=value`` of a ``--set`` flag, the value read as YAML; a :class:`UsageError` otherwise."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        _fail(f"{flag} {text!r}: expected key=value, e.g. {flag} outputs[0].image.quality=90")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError as exc:
        _fail(f"{flag} {text!r}: the value is not valid YAML ({exc})")


def _section(data: dict[str, Any], key: str) -> dict[str, Any]:
    """``data[key]`` (created empty) to set flags in; a detached dict when the recipe holds something
    else there, which the recipe check then names."""
    value = data.setdefault(key, {})
    return value if isinstance(value, dict) else {}


def _source_dicts(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The recipe's source mappings (one empty one when it has none) for the source flags."""
    sources = data.setdefault("sources", [{}])
    return [s for s in sources if isinstance(s, dict)] if isinstance(sources, list) else []


def _ltx_flags(data: dict[str, Any], flags: dict[str, Any]) -> None:
    """The LTX-2 trainer's preprocessing flags (``scripts/process_dataset.py``), same spelling and
    meaning: ``--resolution-buckets "WxHxF;WxHxF"`` (``geometry.buckets``), ``--caption-column``,
    ``--video-column`` / ``--media-column`` (the table's caption and target columns),
    ``--lora-trigger`` (``lora_trigger``), ``--device`` (``models.device``), ``--skip-audio``
    (``audio.skip``), ``--audio-durations "2.0;4.0;8.0"`` (``audio.durations``)."""
    if flags.get("resolution_buckets") is not None:
        from shardsmith.transform.buckets import BucketError, parse_buckets

        buckets = [b.strip() for b in flags["resolution_buckets"].split(";")]
        try:
            if not all(buckets):
                raise BucketError("an empty bucket between ';'")
            parse_buckets(buckets)
        except BucketError as exc:
            _fail(f"--resolution-buckets {flags['resolution_buckets']!r}: {exc}; write WxHxF buckets separated by "
                  "';', e.g. \"768x448x89;512x512x49\" (width x height x frames, F=1 for images)")
        _section(data, "geometry")["buckets"] = buckets
    media = {f"--{k.replace('_', '-')}": flags[k] for k in ("video_column", "media_column") if flags.get(k)}
    if len(set(media.values())) > 1:
        _fail(f"--video-column {flags['video_column']!r} and --media-column {flags['media_column']!r} name the same "
              "role (the media path column); give one")
    for s in _source_dicts(data) if (media or flags.get("caption_column")) else []:
        cols = s.setdefault("columns", {})
        if not isinstance(cols, dict):
            continue  # the recipe check names it
        if media:
            flag, col = next(iter(media.items()))
            key = "target" if "target" in cols else "media"
            if cols.get(key) not in (None, col):
                _fail(f"{flag} {col!r} and columns.{key} {cols[key]!r} both set the media column; give one")
            cols[key] = col
        if flags.get("caption_column"):
            if cols.get("caption") not in (None, flags["caption_column"]):
                _fail(f"--caption-column {flags['caption_column']!r} and columns.caption {cols['caption']!r} both "
                      "set the caption column; give one")
            cols["caption"] = flags["caption_column"]
    if flags.get("lora_trigger") is not None:
        data["lora_trigger"] = flags["lora_trigger"]
    if flags.get("device") is not None:
        _section(data, "models")["device"] = flags["device"]
    if flags.get("skip_audio"):
        _section(data, "audio")["skip"] = True
    if flags.get("audio_durations") is not None:
        from shardsmith.transform.audio import parse_durations

        try:
            _section(data, "audio")["durations"] = parse_durations(flags["audio_durations"])
        except ValueError as exc:
            _fail(f"--audio-durations {flags['audio_durations']!r}: {exc}; write seconds separated by ';', "
                  "e.g. \"2.0;4.0;8.0\"")


RECIPE_MAX_BYTES = 1 << 20  # a recipe in a table's suffix (.json) larger than this is taken for a table


def _dataset_file(path: Optional[Path]) -> bool:
    """Whether ``build``'s argument is a dataset table (csv/json/jsonl/parquet rows) rather than a
    recipe: a table file that is not a recipe mapping (the LTX trainer's and img2dataset's habit)."""
    from shardsmith.sources.base import TABLE_EXTENSIONS

    if path is None or path.suffix.lower().lstrip(".") not in TABLE_EXTENSIONS or not path.is_file():
        return False
    if path.stat().st_size > RECIPE_MAX_BYTES:  # (a table that size is not parsed as YAML first: seconds a MB)
        return True
    try:
        _read_recipe_file(path)
    except UsageError:
        return True
    return False


def _raw_recipe(recipe_path: Optional[Path], sources: list[str], flags: dict[str, Any], to: list[str],
                sets: list[str]) -> tuple[dict[str, Any], Path]:
    """Merge a recipe file (optional) with CLI flags into one raw dict; returns (dict, base dir)."""
    if recipe_path is not None:
        data = _read_recipe_file(recipe_path)
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
            for s in _source_dicts(data):
                s[key] = flags[flag]
    if flags.get("columns"):
        cols = _pairs("--columns", flags["columns"], "media=file,caption=text")
        for s in _source_dicts(data):
            s["columns"] = cols
    _ltx_flags(data, flags)
    for flag in ("holdout", "seed"):
        if flags.get(flag) is not None:
            _section(data, "split")[flag] = flags[flag]
    if flags.get("no_dedup"):
        _section(data, "split")["dedup"] = False
    for flag in ("min_size", "max_pixels"):
        if flags.get(flag) is not None:
            _section(data, "images")[flag] = flags[flag]
    if flags.get("upscale"):
        _section(data, "images")["upscale"] = True
    if flags.get("background"):
        _section(data, "images")["background"] = _ints("--background", flags["background"], ",",
                                                       "three integers R,G,B such as 255,255,255")
    _output_flags(data, flags)
    if flags.get("workers") is not None:
        data["workers"] = flags["workers"]
    if flags.get("text_8bit"):  # overrides the file's models.text.quantize (checked again after --set)
        text = _section(data, "models").get("text")
        if isinstance(text, dict):
            text["quantize"] = "int8"
    if flags.get("gpus") is not None:
        g = flags["gpus"]
        if g != "all" and not (g.isdigit() and int(g) >= 1):
            _fail(f"--gpus {g!r}: give a number of GPUs (1, 2, ...) or all")
        _section(data, "distribute")["gpus"] = g if g == "all" else int(g)
    if flags.get("engine") is not None:
        _section(data, "distribute")["engine"] = flags["engine"]
    if flags.get("one_sample"):
        data["one_sample"] = True
    for s in sets:
        set_key(data, *_setting("--set", s))
    if recipe_path is None and "outputs" not in data:  # flags only: the fix is a flag, not a recipe key
        _fail(f"no output format given: pass --to FORMAT (repeatable), one of {'|'.join(_output_fields())}; "
              "e.g. --to wds")
    if flags.get("text_8bit"):  # after --set: the text encoder may come from it (a --set quantize wins)
        models = data.get("models")
        text = models.get("text") if isinstance(models, dict) else None
        if not isinstance(text, dict):
            _fail("--load-text-encoder-in-8bit quantizes models.text, and the recipe sets no text encoder; add "
                  "models: {text: {family: ...}} (or --set models.text.family=...) or leave the flag out")
        text.setdefault("quantize", "int8")
    _check_engine(data, flags)
    _check_table_flags(data, flags, base)
    return data, base


#: the formats that take the shard-layout flags (--dir, --samples-per-shard, --max-shard-bytes)
_SHARD_FORMATS = ("wds", "latent_wds", "prompt_wds")

#: output flags (their key in ``flags``) -> (the formats they apply to, their key in such an output)
_OUTPUT_FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "dir": (_SHARD_FORMATS, "dir"),
    "samples_per_shard": (_SHARD_FORMATS, "samples_per_shard"),
    "max_shard_bytes": (_SHARD_FORMATS, "max_shard_bytes"),
    "image_format": (("wds",), "image.format"),
    "quality": (("wds",), "image.quality"),
    "max_side": (("wds",), "image.max_side"),
    "image_size": (("wds",), "image.size"),
    "resize_mode": (("wds",), "image.resize_mode"),
    "max_aspect": (("wds",), "image.max_aspect"),
    "passthrough": (("wds",), "image.passthrough"),
    "resolution": (("zip",), "resolution"),
    "transform": (("zip",), "transform"),
    "zip_path": (("zip",), "path"),
}

#: (flag, format it does not apply to) -> the flag that sets the like thing there, and what it takes
_LIKE_FLAG: dict[tuple[str, str], tuple[str, str]] = {
    ("resolution", "wds"): ("image_size", "{value}"),
    ("transform", "wds"): ("resize_mode", "center_crop|border|keep_ratio"),
    ("zip_path", "wds"): ("dir", "DIR"),
    ("image_size", "zip"): ("resolution", "{value}"),
    ("resize_mode", "zip"): ("transform", "center-crop|center-crop-wide|center-crop-dhariwal"),
    ("dir", "zip"): ("zip_path", "PATH.zip"),
}


def _flag_name(flag: str) -> str:
    return f"--{flag.replace('_', '-')}"


def _output_fields() -> dict[str, set[str]]:
    """Each output format's top-level recipe keys."""
    from typing import get_args

    from shardsmith.recipe import Output

    return {get_args(cls.model_fields["format"].annotation)[0]: set(cls.model_fields)
            for cls in get_args(get_args(Output)[0])}


def _output_flags(data: dict[str, Any], flags: dict[str, Any]) -> None:
    """Set each output flag given on every output of a format it applies to; a flag that applies to no
    output of the recipe is a :class:`UsageError` naming the formats it applies to and the fix (never
    silently dropped)."""
    given: dict[str, Any] = {}
    for flag in _OUTPUT_FLAGS:
        value = flags.get(flag)
        if value is None or value is False:
            continue
        if flag == "resolution":
            r = _ints("--resolution", value, "x", "one integer such as 64, or WxH such as 64x32")
            value = r if len(r) > 1 else r[0]
        given[flag] = value
    outs = data.get("outputs") or []
    outs = [o for o in outs if isinstance(o, dict)] if isinstance(outs, list) else []  # the recipe check names others
    fields = _output_fields()
    for flag, value in given.items():
        formats, key = _OUTPUT_FLAGS[flag]
        matched = [o for o in outs if o.get("format") in formats]
        for o in matched:
            *parents, last = key.split(".")
            target = o
            for p in parents:
                target = target.setdefault(p, {})
            if isinstance(target, dict):  # else the recipe check names what the recipe holds there
                target[last] = value
        if matched or not outs or any(o.get("format") not in fields for o in outs):
            continue  # no output, or an unknown format: the recipe check says what is wrong
        present = [o["format"] for o in outs]
        hints: list[str] = []
        for i, fmt in enumerate(present):
            if fmt in present[:i]:
                continue  # one hint per format
            like = _LIKE_FLAG.get((flag, fmt))
            if like is not None:
                like_flag, takes = like
                takes = takes.format(value=value if isinstance(value, (int, str)) else "S")
                hints.append(f"for {fmt} use {_flag_name(like_flag)} {takes}" if like_flag in flags else  # the
                             f"for {fmt} use --set outputs[{i}].{_OUTPUT_FLAGS[like_flag][1]}={takes}")  # command's
            elif key.split(".")[0] in fields[fmt]:
                hints.append(f"for {fmt} use --set outputs[{i}].{key}="
                             f"{value if isinstance(value, str) else json.dumps(value, separators=(',', ':'))}")
        if "to" in flags:
            hints.append(f"add a {formats[0]} output (--to {formats[0]})")
        what = formats[0] if len(formats) == 1 else f"{', '.join(formats[:-1])} or {formats[-1]}"
        _fail(f"{_flag_name(flag)} applies to {what} outputs, and no output is one (outputs: {', '.join(present)}); "
              f"{', '.join(hints) + ', or ' if hints else ''}leave {_flag_name(flag)} out")


def _is_table(source: dict[str, Any]) -> bool:
    from shardsmith.sources.base import TABLE_EXTENSIONS

    path = source.get("path")
    return source.get("kind") == "table" or (
        source.get("kind", "auto") == "auto" and isinstance(path, str)
        and Path(path).suffix.lower().lstrip(".") in TABLE_EXTENSIONS)


def _check_table_flags(data: dict[str, Any], flags: dict[str, Any], base: Path) -> None:
    """The column flags apply to table sources: with none among the sources they are a
    :class:`UsageError` (a folder's captions are sidecar files and its labels its sub-folders)."""
    used = [f for f in ("columns", "caption_column", "video_column", "media_column") if flags.get(f)]
    srcs = _source_dicts(data) if isinstance(data.get("sources"), list) else []
    if not used or not srcs or any(_is_table(s) for s in srcs):
        return
    s = srcs[0]
    path = s.get("path")
    what = "a folder" if isinstance(path, str) and (base / path).is_dir() else "not a table"
    _fail(f"{_flag_name(used[0])} applies to table sources (.csv, .json, .jsonl, .parquet), and source {path!r} is "
          f"{what}; a folder's captions are <name>.txt files beside each image and its labels its class sub-folders, "
          f"so leave {_flag_name(used[0])} out (or pass the table itself as the source)")


def _check_engine(data: dict[str, Any], flags: dict[str, Any]) -> None:
    """``--engine ray`` with one GPU (no ``--gpus``, ``distribute.gpus`` 1) would be ignored: the build's
    own process encodes, and Ray runs only for ``--gpus N`` (N > 1 or all). A :class:`UsageError`."""
    if flags.get("engine") != "ray":
        return
    dist = data.get("distribute")
    gpus = dist.get("gpus", 1) if isinstance(dist, dict) else 1
    if gpus == 1:
        told = flags.get("gpus") is not None or (isinstance(dist, dict) and "gpus" in dist)
        _fail(f"--engine ray runs the encoders on Ray actors, one per GPU of --gpus, and --gpus is 1"
              f"{'' if told else ' (the default)'}, which encodes in the build's own process without Ray; add "
              "--gpus N (2 or more, or all), or leave --engine ray out")


_SRC_HELP = "A source: image folder (class sub-folders become labels) or table (.csv/.json/.jsonl/.parquet)."


def _recipe(recipe_path, source, flags, to, sets, origin):
    data, base = _raw_recipe(recipe_path, source or [], flags, to or [], sets or [])
    return recipe_from_dict(data, base_dir=base, origin=origin)


_HOLDOUT_HELP = "split.holdout: a fraction (0.1), a percentage (10%) or a count (100)."


def _positive(value: float) -> float:
    """A float option that must be above 0, checked when the flags are parsed (typer's ``min=``
    allows the bound itself)."""
    if not value > 0:  # NaN too
        raise typer.BadParameter(f"{value:g} is not above 0; give a number such as 20")
    return value


@command()
def build(
    recipe_path: Optional[Path] = typer.Argument(None, metavar="[RECIPE.yaml | DATASET.csv]",
                                                 help="Recipe file (YAML), or a dataset table (csv/json/jsonl/"
                                                 "parquet) to build from as a source (--to defaults to wds)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder (created; never overwritten without --overwrite)."),
    source: Optional[list[str]] = typer.Option(None, "--source", help=_SRC_HELP),
    to: Optional[list[str]] = typer.Option(None, "--to", help="Output format (repeatable): wds, zip, latent_wds, "
                                           "precomputed, latent_zip, video_wds, prompt_wds or kd_wds."),
    origin: Optional[str] = typer.Option(None, help="sources[*].origin"),
    license: Optional[str] = typer.Option(None, "--license", help="sources[*].license (declared by you)."),
    columns: Optional[str] = typer.Option(None, help="sources[*].columns, e.g. media=file,caption=text,label=cls"),
    labels: Optional[str] = typer.Option(None, help="sources[*].labels: auto | none"),
    caption_errors: Optional[str] = typer.Option(None, help="sources[*].caption_errors: fail | replace"),
    holdout: Optional[str] = typer.Option(None, help=_HOLDOUT_HELP),
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
    image_size: Optional[int] = typer.Option(None, "--image-size", help="wds: image.size, every image resized to "
                                             "this by --resize-mode (img2dataset's image_size)"),
    resize_mode: Optional[str] = typer.Option(None, "--resize-mode", help="wds: image.resize_mode: center_crop | "
                                              "border | keep_ratio"),
    max_aspect: Optional[float] = typer.Option(None, "--max-aspect", help="wds: image.max_aspect; skip images "
                                               "whose long/short side ratio is above it"),
    resolution_buckets: Optional[str] = typer.Option(None, "--resolution-buckets", help="geometry.buckets as the "
                                                     "LTX trainer writes them: \"768x448x89;512x512x49\" (WxHxF)"),
    caption_column: Optional[str] = typer.Option(None, "--caption-column", help="sources[*].columns.caption"),
    video_column: Optional[str] = typer.Option(None, "--video-column", help="sources[*].columns.media"),
    media_column: Optional[str] = typer.Option(None, "--media-column", help="sources[*].columns.media "
                                               "(same as --video-column)"),
    lora_trigger: Optional[str] = typer.Option(None, "--lora-trigger", help="lora_trigger: prepended to every "
                                               "caption with a space (recorded in the manifest and cache stamp)"),
    device: Optional[str] = typer.Option(None, "--device", help="models.device: auto | cuda | cuda:N | cpu"),
    skip_audio: bool = typer.Option(False, "--skip-audio", help="audio.skip=true: no audio latents, said in the "
                                    "manifest (the LTX trainer's --skip-audio)"),
    text_8bit: bool = typer.Option(False, "--load-text-encoder-in-8bit", help="models.text.quantize=int8: int8 "
                                   "text-encoder weights for small GPUs (the LTX trainer's flag)"),
    audio_durations: Optional[str] = typer.Option(None, "--audio-durations", help="audio.durations: duration "
                                                  "buckets of audio-only items in seconds, \"2.0;4.0;8.0\""),
    zip_path: Optional[str] = typer.Option(None, "--zip-path", help="zip output: outputs[*].path"),
    resolution: Optional[str] = typer.Option(None, help="zip: resolution, 64 or WxH"),
    transform: Optional[str] = typer.Option(None, help="zip: center-crop | center-crop-wide | center-crop-dhariwal"),
    workers: Optional[int] = typer.Option(None, help="workers: CPU processes (default: all cores, max 8)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="distribute.gpus: one worker process per GPU, N or "
                                       "all (the same bytes as one GPU)"),
    engine: Optional[str] = typer.Option(None, "--engine", help="distribute.engine: local | ray (a Ray cluster: "
                                         "--set distribute.address=ray://host:10001)"),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Any recipe key: --set outputs[0].image.quality=90"),
    one_sample: bool = typer.Option(False, "--one-sample", help="one_sample=true: only the first usable item, "
                                    "at full resolution (use its own --out, e.g. overfit/)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Rebuild beside the old output; swap in when complete."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars or summary."),
    no_report: bool = typer.Option(False, "--no-report", help="Do not write OUT/report.html at the end "
                                   "(shardsmith report OUT writes it later)."),
):
    """Build every output of a recipe (or of flags) into --out, resumably and fully accounted."""
    from shardsmith.build import InvariantError, build as run_build
    from shardsmith.manifest import nothing_written, written_phrase

    flags = dict(locals())
    if _dataset_file(recipe_path):  # `build DATASET.csv --out OUT`: the table is the source
        source, to, recipe_path = [str(recipe_path), *(source or [])], to or ["wds"], None
    if recipe_path is None and not source:
        _fail("give a RECIPE.yaml, a dataset file (csv/json/jsonl/parquet) or at least one --source (and --to)")
    if device not in (None, "auto", "cpu"):
        from shardsmith.precheck import resolve_device

        if not (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
            _fail(f"--device {device!r}: use auto, cuda, cuda:N (N a visible GPU index, e.g. cuda:1) or cpu")
        resolve_device(device, "--device")  # asked for by name: checked even when no model runs
    recipe = _recipe(recipe_path, source, flags, to, set_, str(recipe_path or "<command line>"))
    try:
        manifest = run_build(recipe, out, overwrite=overwrite, quiet=quiet, workers=workers, report=not no_report)
    except InvariantError as exc:  # not the user's doing: a bug, exit code 3
        _exit(str(exc), 3)
    process_exit.done()  # (complete on disk, whatever it holds)
    if (empty := nothing_written(manifest, str(out))) is not None:  # a build that ran and holds nothing: exit 3
        _exit(empty, NOTHING_WRITTEN_EXIT)
    if not quiet:
        from shardsmith.formats.build_dir import REPORT_FILE

        shown = f" and {out / REPORT_FILE}" if not no_report and (out / REPORT_FILE).is_file() else ""
        typer.echo(f"done: {out} ({written_phrase(manifest)}; see {out}/manifest.json{shown})")


@command()
def distill(
    recipe_path: Path = typer.Argument(..., metavar="RECIPE.yaml", help="A recipe with a kd_wds output, "
                                       "models.teacher, models.text and distill:."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder (created; never overwritten without --overwrite)."),
    solver: Optional[str] = typer.Option(None, help="distill.solver: euler | heun"),
    steps: Optional[int] = typer.Option(None, help="distill.steps: solver steps from t_list[0] to 0"),
    guidance: Optional[float] = typer.Option(None, help="distill.guidance: classifier-free guidance scale"),
    negative_prompt: Optional[str] = typer.Option(None, "--negative-prompt", help="distill.negative_prompt"),
    seed: Optional[int] = typer.Option(None, help="distill.seed: every sample's seed derives from it and its id"),
    preview: Optional[int] = typer.Option(None, help="distill.preview: sample N training prompts first and write "
                                          "their decoded pictures to OUT/preview/"),
    device: Optional[str] = typer.Option(None, "--device", help="models.device: auto | cuda | cuda:N | cpu"),
    workers: Optional[int] = typer.Option(None, help="workers: CPU processes (default: all cores, max 8)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="distribute.gpus: one teacher per GPU, N or all"),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Any recipe key: --set distill.steps=64"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Rebuild beside the old output; swap in when complete."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars or summary."),
    no_report: bool = typer.Option(False, "--no-report", help="Do not write OUT/report.html at the end."),
):
    """Sample the teacher on every training prompt: knowledge-distillation pairs and trajectories
    (FastGen's kd_pair / kd_path), resumably and fully accounted."""
    from shardsmith.build import InvariantError
    from shardsmith.distill.run import distill as run_distill
    from shardsmith.manifest import nothing_written

    sets = [f"distill.{k}={v}" for k, v in (("solver", solver), ("steps", steps), ("guidance", guidance),
                                            ("seed", seed), ("preview", preview)) if v is not None]
    if negative_prompt is not None:
        sets.append(f"distill.negative_prompt={json.dumps(negative_prompt)}")
    if device is not None:
        sets.append(f"models.device={device}")
    recipe = _recipe(recipe_path, [], {"workers": workers, "gpus": gpus}, [], sets + list(set_ or []),
                     str(recipe_path))
    try:
        manifest = run_distill(recipe, out, overwrite=overwrite, quiet=quiet, workers=workers, report=not no_report)
    except InvariantError as exc:  # not the user's doing: a bug, exit code 3
        _exit(str(exc), 3)
    c = manifest["counts"]
    process_exit.done()  # (complete on disk, whatever it holds)
    if (empty := nothing_written(manifest, str(out))) is not None:  # no prompt sampled: exit 3, as build's
        _exit(empty, NOTHING_WRITTEN_EXIT)
    if not quiet:
        typer.echo(f"done: {out} ({c['written']} of {c['inputs']} prompts sampled; see {out}/manifest.json)")


@command()
def scan(
    source: Optional[list[str]] = typer.Argument(None, help=_SRC_HELP + " Default: the --recipe's sources."),
    recipe_path: Optional[Path] = typer.Option(None, "--recipe", help="Take sources (unless given), split, images, "
                                               "geometry.buckets, models and outputs from this recipe."),
    to: Optional[list[str]] = typer.Option(None, "--to", help="Output spec to estimate the size of: wds or zip."),
    license: Optional[str] = typer.Option(None, "--license"),
    origin: Optional[str] = typer.Option(None),
    columns: Optional[str] = typer.Option(None),
    resolution: Optional[str] = typer.Option(None),
    transform: Optional[str] = typer.Option(None),
    image_format: Optional[str] = typer.Option(None),
    quality: Optional[int] = typer.Option(None),
    max_side: Optional[int] = typer.Option(None),
    holdout: Optional[str] = typer.Option(None, help=_HOLDOUT_HELP),
    seed: Optional[int] = typer.Option(None),
    min_size: Optional[int] = typer.Option(None),
    batch: Optional[int] = typer.Option(None, min=1, help="Training batch size per device (for the repetition "
                                        "estimate)."),
    grad_accum: int = typer.Option(1, "--grad-accum", min=1, help="Gradient-accumulation steps per update."),
    world: int = typer.Option(1, "--world", min=1, help="Devices (data-parallel ranks) training at once."),
    updates: Optional[int] = typer.Option(None, min=1, help="Planned optimizer updates."),
    max_repeat: float = typer.Option(20.0, callback=_positive, help="Warn when each sample would be seen more "
                                     "often than this (> 0)."),
    set_: Optional[list[str]] = typer.Option(None, "--set"),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable report on stdout."),
    max_probe: int = typer.Option(2000, "--max-probe", min=1, help="Probe at most this many clips (a "
                                  "deterministic sample of a larger folder; the report says so)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
    probe_models: bool = typer.Option(False, "--probe-models", help="With --recipe: load its models on its "
                                      "device and run one batch of each bucket and of text: GPU memory per model "
                                      "at the batch size, whether it fits, the largest batch that fits, the rate "
                                      "and the expected encode time."),
):
    """Probe sources without writing a dataset: kinds, sizes, problems, duplicates, licences; video frames,
    fps, durations and sizes, audio; with --recipe, which clip fits which bucket and each output's size."""
    from shardsmith.progress import Progress
    from shardsmith.scan import format_scan, scan as run_scan

    flags = dict(locals())
    if not source and recipe_path is None:
        _fail("scan needs a source (a folder or a table) or --recipe R.yaml")
    to = to or ([] if recipe_path else ["wds"])
    data, base = _raw_recipe(recipe_path, source, flags, to, set_ or [])
    if any(o.get("format") == "zip" and "resolution" not in o for o in data.get("outputs", [])):
        for o in data["outputs"]:
            o.setdefault("resolution", 64) if o.get("format") == "zip" else None
    recipe = recipe_from_dict(data, base_dir=base, origin="<scan>")
    from shardsmith.precheck import check_buckets, check_latent_zip

    check_buckets(recipe)  # the model-free geometry checks build runs first: a bucket it refuses is no fit
    check_latent_zip(recipe)
    if probe_models and (recipe_path is None or not (recipe.models.vae or recipe.models.text)):
        _fail("--probe-models needs --recipe R.yaml with models.vae or models.text")
    if probe_models:
        from shardsmith.precheck import precheck

        precheck(recipe)  # a wrong device or model config stops here, before the scan
    result = run_scan(recipe, batch=batch, updates=updates, max_repeat=max_repeat, max_probe=max_probe,
                      progress=Progress(quiet=quiet), grad_accum=grad_accum, world=world)
    if probe_models:
        from shardsmith.scan.model_probe import probe_models as run_probe

        result["models_probe"] = run_probe(recipe, result.get("enough_data", {}).get("usable"))
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    else:
        typer.echo(format_scan(result))
        for line in result.get("models_probe", {}).get("lines", []):
            typer.echo(line)


def main() -> None:
    """The console entry: the app, left without the interpreter's teardown once a build is on disk
    (:mod:`shardsmith.process_exit`)."""
    process_exit.run(app, prog_name="shardsmith")


def _key_map(text: Optional[str]) -> Optional[dict[str, str]]:
    if not text:
        return None
    return _pairs("--key-map", text, "real=latent.pth,condition=txt_emb.pth")


@command(also=(ValueError, KeyError, FileNotFoundError))  # verify's API raises these for a wrong dataset or option
def verify(
    dataset: Path = typer.Argument(..., help="A WebDataset folder (*.tar) or an EDM .zip."),
    preset: Optional[str] = typer.Option(None, help="Loader preset: image, image_latent, kd_pair, class_zip, "
                                         "latent_v2v_ic, image_edit, ... (default for a dataset built with a "
                                         "recipe mode: that mode's preset, from the build's manifest)"),
    key_map: Optional[str] = typer.Option(None, "--key-map", help="real=jpg,condition=txt (default: inferred)"),
    world: int = typer.Option(2, min=1, help="Simulated ranks (real processes)."),
    workers: int = typer.Option(2, min=0, help="DataLoader workers per rank."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1,
                                             help="Default: the preset's batch size (8 without a preset)."),
    batches: Optional[int] = typer.Option(None, min=1,
                                          help="Stop each rank after this many batches (no coverage check)."),
    image_size: Optional[int] = typer.Option(None, min=1, help="Decode images to float CHW at this size."),
    contract_in: str = typer.Option("auto", "--contract-in",
                                    help="auto (default): workers with 4+ workers per rank, else rank. "
                                         "workers: batches cross to their rank process as in "
                                         "training; the workers record the value statistics, the rank checks "
                                         "every batch's keys, dtypes and shapes and re-reads 1 in 16 in full. "
                                         "rank: the rank records everything (slowest). workers-only: the "
                                         "workers send only ids and statistics."),
    as_json: bool = typer.Option(False, "--json"),
    out_json: Optional[Path] = typer.Option(None, "--out-json", help="Also write the report here."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Loader override of the preset, e.g. "
                                             "--set num_frames=17 --set video_size=[64,96] (YAML value)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    mode: Optional[str] = typer.Option(None, "--mode", help=".precomputed/ trees: the LTX training mode whose "
                                       "folders and condition keys to check (t2v, i2v, v2v-ic, t2a, ...; default: "
                                       "the tree's stamp, else inferred from its folders)"),
):
    """Iterate the real loader over ranks x workers; check coverage, counts, splits and the batch contract."""
    _must_exist(dataset, "give an EDM .zip, a folder with .tar shards or a .precomputed/ tree")
    if out_json:
        _check_out_json(out_json, dataset)
    overrides = _loader_overrides(set_, dataset, preset)
    from shardsmith.progress import Progress
    from shardsmith.verify.runner import format_verify, verify as run_verify  # (torch: after the cheap checks)

    rep = run_verify(dataset, preset=preset, key_map=_key_map(key_map), world=world, workers=workers,
                     batch_size=batch_size, batches=batches, image_size=image_size, contract_in=contract_in,
                     overrides=overrides or None, progress=Progress(quiet=quiet), mode=mode)
    text = json.dumps(rep, indent=2, default=str, ensure_ascii=False)
    if out_json:
        from shardsmith.atomic import atomic_write_bytes

        atomic_write_bytes(out_json, (text + "\n").encode("utf-8"))
    typer.echo(text if as_json else format_verify(rep))
    raise typer.Exit(0 if rep["ok"] else 1)


def _must_exist(path: Path, takes: str) -> None:
    """Refuse a ``path`` argument that does not exist (``takes``: what the command takes instead), or that this
    user may not read (``cannot read PATH: permission denied``, :func:`~shardsmith.user_paths.user_path_exists`),
    at once, before the command imports its heavy modules (torch and the model libraries: seconds). A path
    that an unfinished build has not written yet is left to the command, which says the build is not finished."""
    if user_path_exists(path):
        return
    from shardsmith.verify.owning_build import unfinished_build

    if unfinished_build(path) is None:
        _fail(f"{path} does not exist; {takes}")


def _check_out_json(path: Path, dataset: Path) -> None:
    """``verify --out-json``, checked before the run: a file outside the dataset, in a folder that exists and
    this user can write in (a folder on the way that it may not look into, or a file on the way, is said too:
    :mod:`shardsmith.user_paths`), and either new or a verify report written before (verify never overwrites
    another file)."""
    p, d = resolve_user_path(path, "--out-json"), resolve_user_path(dataset)
    if p == d or d in p.parents:
        _fail(f"--out-json {path} lies inside the dataset {dataset}, which verify only reads; give a path outside "
              "it, e.g. verify.json")
    if nearest_folder(p.parent, path, "--out-json") != p.parent:
        _fail(f"--out-json {path}: the folder {p.parent} does not exist (it is not created); create it first")
    if p.is_dir():
        _fail(f"--out-json {path} is a folder; give a file name, e.g. {path / 'verify.json'}")
    if user_path_exists(p, "--out-json"):
        from shardsmith.atomic import read_json

        try:
            old = read_json(p) if p.is_file() else None
        except (OSError, UnicodeDecodeError, ValueError):
            old = None
        if not (isinstance(old, dict) and {"dataset", "checks", "ok"} <= set(old)):
            _fail(f"--out-json {path} exists and is not a verify report (verify never overwrites another file): "
                  "pick a new file name, or delete that file yourself first")
    check_writable(p.parent, path, "--out-json")  # (written after the whole run: refused now, not then)


def _loader_overrides(sets: Optional[list[str]], dataset: Path, preset: Optional[str]) -> dict[str, Any]:
    """``verify --set key=value`` as loader-config overrides, checked against the preset's config
    now: a key it does not have, or a bad value, is one line naming the key."""
    overrides = dict(_setting("--set", s) for s in sets or [])
    if overrides and preset is not None:
        from pydantic import ValidationError

        from shardsmith.loaders.presets import preset_config

        try:
            preset_config(preset, dataset, **overrides)
        except ValidationError as exc:
            e = exc.errors()[0]
            key = ".".join(str(p) for p in e["loc"]) or "?"
            _fail(f"--set {key}: {e['msg']} (for the {preset} preset's loader config)")
    return overrides


def _precomputed_tree(dataset: Path) -> bool:
    """Whether ``dataset`` is an LTX ``.precomputed/`` tree (``inspect`` and ``repair`` read those too)."""
    from shardsmith.formats.detect import dataset_kind

    try:
        return dataset.is_dir() and dataset_kind(dataset) == "precomputed"
    except ValueError:
        return False


def _wds_folder(dataset: Path, command_name: str) -> None:
    """Refuse anything but a folder (``inspect`` and ``repair`` read WebDataset shard folders)."""
    if not dataset.is_dir():
        what = "does not exist" if not dataset.exists() else "is a file"
        _fail(f"{dataset} {what}; {command_name} takes a folder of .tar shards"
              + (" (for an EDM .zip use: shardsmith verify)" if dataset.suffix.lower() == ".zip" else ""))
    from shardsmith.formats.detect import build_folder_message, dataset_kind

    hint = build_folder_message(dataset)  # a build's own folder, given for one of its outputs
    if hint is not None:
        try:
            dataset_kind(dataset)
        except ValueError:
            _fail(hint)


@command()
def inspect(
    dataset: Path = typer.Argument(..., help="A WebDataset folder."),
    key_map: Optional[str] = typer.Option(None, "--key-map"),
    world: int = typer.Option(1, min=1, help="For the empty-batch diagnosis."),
    workers: int = typer.Option(1, min=0, help="For the empty-batch diagnosis."),
    as_json: bool = typer.Option(False, "--json"),
):
    """Per shard: members by suffix, missing members, dotted keys, non-adjacent members, truncation, counts.
    A .precomputed/ tree: per folder file counts, unpaired and unreadable .pt files, shapes."""
    user_path_exists(dataset)  # (a path this user may not read: one message, not a PermissionError)
    if _precomputed_tree(dataset):
        from shardsmith.progress import Progress
        from shardsmith.verify.precomputed_inspect import format_inspect_precomputed, inspect_precomputed

        rep = inspect_precomputed(dataset, progress=Progress())  # a bar on a terminal's stderr only
        typer.echo(json.dumps(rep, indent=2, default=str, ensure_ascii=False) if as_json
                   else format_inspect_precomputed(rep))
        raise typer.Exit(0 if rep["ok"] else 1)
    _wds_folder(dataset, "inspect")
    from shardsmith.verify.empty_batches import diagnose_empty
    from shardsmith.verify.inspect import format_inspect, inspect_wds

    rep = inspect_wds(dataset, _key_map(key_map))
    rep["diagnosis"] = diagnose_empty(rep, world, workers)
    if as_json:
        typer.echo(json.dumps(rep, indent=2, default=str, ensure_ascii=False))
    else:
        typer.echo(format_inspect(rep))
        d = rep["diagnosis"]
        typer.echo(f"empty/short batches checklist: {d['verdict']}: {d['explanation']}")
    raise typer.Exit(0 if rep["ok"] else 1)


@command()
def repair(
    dataset: Path = typer.Argument(..., help="A WebDataset folder."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Report what would change; write nothing."),
    from_source: bool = typer.Option(False, "--from-source",
                                     help="For a shardsmith build whose ledger and sources are present: rebuild "
                                          "damaged shards from the sources, byte-identical to the build."),
    as_json: bool = typer.Option(False, "--json"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
):
    """Rewrite truncated shards from intact samples (originals kept), ignore corrupt samples, rebuild counts.
    A .precomputed/ tree: move unreadable and unpaired .pt files into the build's quarantine folder."""
    from shardsmith.formats.detect import build_folder_message
    from shardsmith.verify.repair import REPAIR_THEN, refuse_unfinished_build

    user_path_exists(dataset)  # (a path this user may not read: one message, not a PermissionError)
    if _precomputed_tree(dataset):  # (repair_precomputed refuses a tree of an unfinished build)
        from shardsmith.verify.precomputed_inspect import (format_repair_precomputed, from_source_refusal,
                                                           repair_precomputed)

        if from_source:
            _fail(from_source_refusal(dataset))

        rep = repair_precomputed(dataset, dry_run=dry_run)
        typer.echo(json.dumps(rep, indent=2, default=str, ensure_ascii=False) if as_json
                   else format_repair_precomputed(rep))
        raise typer.Exit(1 if rep.get("errors") else 0)
    if not dataset.is_dir() or build_folder_message(dataset) is not None:
        # repair_wds, which refuses a dataset of an unfinished build, is not reached: an output not written yet,
        # or the build folder itself, of such a build is refused here (once per run)
        refuse_unfinished_build(dataset, REPAIR_THEN)
    _wds_folder(dataset, "repair")
    from shardsmith.verify.repair import format_repair, lost_now, missing_lines, repair_wds

    from shardsmith.progress import Progress

    rep = repair_wds(dataset, dry_run=dry_run, from_source=from_source, progress=Progress(quiet=quiet))
    typer.echo(json.dumps(rep, indent=2, default=str, ensure_ascii=False) if as_json else format_repair(rep))
    if as_json:  # (the text output has them among its lines)
        for line in missing_lines(rep):
            typer.echo(f"warning: {line}", err=True)
    raise typer.Exit(1 if rep.get("errors") or lost_now(rep) else 0)


@command(also=(KeyError, ValueError))  # the registry and preset APIs raise these for a wrong name or override
def register(
    dataset: Path = typer.Argument(..., help="A WebDataset folder, an EDM .zip or a .precomputed/ tree."),
    preset: Optional[str] = typer.Option(None, help="Loader preset (see shardsmith.loaders.LOADER_PRESETS); "
                                         "default for a dataset built with a recipe mode: that mode's preset "
                                         "(latent_v2v_ic, image_edit, ...); not for a .precomputed/ tree (it gets "
                                         "the LTX trainer's data section)."),
    name: str = typer.Option(..., help="Name of the entry in the data config."),
    config: Optional[Path] = typer.Option(None, help="Data-config YAML (default $SHARDSMITH_DATA_CONFIG or "
                                                      "~/.config/shardsmith/data.yaml)."),
    root_env: str = typer.Option("DATA_ROOT_DIR", help="Environment variable that holds the data root."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Loader override, e.g. --set batch_size=16"),
    replace: bool = typer.Option(False, "--replace", help="Replace an existing, different entry of that name."),
):
    """Add DATASET to a data-config file under NAME and print the FastGen preset override to paste
    (for a .precomputed/ tree: the LTX-2 trainer's data section)."""
    from shardsmith.loaders.registry import add_entry, check_config, check_env_name, config_path, portable_path
    from shardsmith.formats.detect import dataset_kind, refuse_unreadable
    from shardsmith.verify.repair import REGISTER_THEN, refuse_unfinished_build

    # the cheap checks first: the preset and loader modules import torch (seconds)
    check_env_name(root_env, "--root-env")  # (exported and written as ${NAME}: a shell's variable name)
    _must_exist(dataset, "give an EDM .zip, a folder with .tar shards or a .precomputed/ tree")
    refuse_unfinished_build(dataset, REGISTER_THEN, UsageError)  # (its files are not all written yet)
    # another program's YAML is refused before the dataset is read (the entry --replace rewrites may be broken)
    check_config(config_path(config), name if replace else None)
    if _precomputed_tree(dataset):
        _register_precomputed(dataset, preset, name, config, root_env, set_, replace)
        return
    kind = dataset_kind(dataset)
    picked = None  # (preset, where it was read): what verify picks for the folder by itself
    if kind in ("wds", "wds_buckets"):
        from shardsmith.loaders.mode_presets import kd_preset_for, mode_preset_for

        kd = kd_preset_for(dataset)  # a knowledge-distillation dataset: kd_path, or kd_pair without path.pth
        mode = mode_preset_for(dataset) if kd is None else None  # a build's recipe mode: that mode's preset
        picked = kd or (mode and (mode[0], f"mode {mode[1].mode} of the build that wrote it ({mode[1].where})"))
    if preset is None and picked is None:
        from shardsmith.loaders.presets import fitting_presets

        fits = ["class_zip"] if kind == "zip" else fitting_presets(dataset)
        _fail(f"--preset is required for {dataset} (a {kind} dataset): "
              + (f"its samples fit --preset {fits[0]}" + (f" (also: {', '.join(fits[1:])})" if fits[1:] else "")
                 if fits else f"no preset reads its samples as they are; {_key_map_fix(dataset)}"))
    from_folder = preset is None
    if from_folder:
        preset = picked[0]
    from shardsmith.loaders.fastgen import fastgen_snippet
    from shardsmith.loaders.presets import fitting_presets, get_preset, held_overrides, preset_config, preset_lacks

    p = get_preset(preset)
    if {"wds_buckets": "wds"}.get(kind, kind) != p.kind:  # a multi-bucket output is one WDS folder per bucket
        _fail(f"preset {preset!r} reads {p.kind} datasets, but {dataset} is a {kind} dataset"
              + ("; register it with --preset class_zip" if kind == "zip" else ""))
    try:
        refuse_unreadable(dataset, kind)  # (bytes that only look like a dataset by their name)
    except ValueError as exc:
        _fail(str(exc))
    overrides = dict(_setting("--set", s) for s in set_ or [])
    preset_config(preset, dataset, **overrides)  # validates the overrides now, not at training time
    # the loader would drop every sample (missing:<member>) or fail at start: a preset for another kind of
    # dataset is refused now, naming the one that fits; one that only lacks a member its samples could go
    # without (images without captions: condition) is said, with the key_map that reads them
    lacks = preset_lacks(preset, dataset, **overrides) if p.kind == "wds" else {}
    held = held_overrides(preset, dataset, **overrides) if lacks else None
    fits = [f for f in fitting_presets(dataset, picked[0] if picked else None) if f != preset] if lacks else []
    if lacks and (held is None or fits):
        what = f" ({picked[0]} reads it: {picked[1]})" if picked else ""
        fix = (f"register it with --preset {fits[0]}" + (f" (also fits: {', '.join(fits[1:])})" if fits[1:] else "")
               if fits else f"rebuild the dataset with those members, or {_key_map_fix(dataset)}")
        _fail(f"preset {preset} does not fit {dataset}{what}: the preset reads {', '.join(lacks.values())}, which "
              f"the dataset lacks, so its loader would load no sample; {fix}")
    if lacks:
        typer.echo(f"warning: preset {preset} reads {', '.join(lacks.values())}, which the samples of {dataset} "
                   "lack: its loader would drop every sample (or fail at start); to read them as they are, "
                   f"register again with --replace {_sets(held)}", err=True)
    path, root = portable_path(dataset, root_env)
    entry = {"preset": preset, "path": path, **({"overrides": overrides} if overrides else {})}
    cfg_file = config_path(config)
    add_entry(cfg_file, name, entry, replace=replace)
    typer.echo(f"registered {name!r} in {cfg_file}: preset {preset}, path {path}")
    if from_folder:
        typer.echo(f"preset {preset}: {picked[1]}")
    if not root:
        _absolute_note(dataset, path, root_env)
    typer.echo(f"\n# Python: from shardsmith.loaders import from_config; loader = from_config({name!r})")
    typer.echo("# FastGen (configs/data.py) override to paste:")
    typer.echo(fastgen_snippet(name, p, path, dataset, root_env, overrides))


def _flow(value: Any) -> str:
    """``value`` as a one-line YAML flow value (what ``--set key=VALUE`` reads)."""
    import yaml

    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False).strip()


def _sets(overrides: dict[str, Any]) -> str:
    """``overrides`` as ``--set 'key=VALUE'`` flags."""
    return " ".join(f"--set '{k}={_flow(v)}'" for k, v in overrides.items())


def _key_map_fix(dataset: Path) -> str:
    """The ``--set key_map=...`` advice for a dataset no preset reads as it is: a preset whose ``real`` member
    its samples hold, with the key_map of the members they hold (images without captions: ``{real: jpg}``)."""
    from shardsmith.loaders.presets import held_overrides

    for name in ("image", "image_latent", "video", "video_latent"):
        try:
            held = held_overrides(name, dataset)
        except (ValueError, KeyError):
            continue
        if held:
            return f"register it with --preset {name} {_sets(held)} (the members its samples hold)"
    return "give a preset a key_map of the members its samples hold with --set key_map=..."


def _absolute_note(dataset: Path, path: str, root_env: str) -> None:
    """``register``'s note where ``$ROOT_ENV`` is unset: the entry holds the dataset's absolute path (it names
    that dataset and no other, but does not move with it), and how to get a portable one."""
    from shardsmith.loaders.registry import suggested_root

    typer.echo(f"note: ${root_env} is not set, so the entry holds the absolute path {path}; for an entry "
               f"that moves between machines, export {root_env}={suggested_root(dataset)} and run this register "
               f"again with --replace (it writes ${{{root_env}}}/...)")


def _register_precomputed(dataset: Path, preset: Optional[str], name: str, config: Optional[Path], root_env: str,
                          sets: Optional[list[str]], replace: bool) -> None:
    """``register`` of a ``.precomputed/`` tree: a ``kind: precomputed`` entry (``from_config``
    gives the shardsmith ``PrecomputedDataset``) and the LTX-2 trainer's data section to paste."""
    from shardsmith.formats.precomputed import present_dirs
    from shardsmith.loaders.ltx import ltx_data_section
    from shardsmith.loaders.registry import add_entry, config_path, portable_path
    from shardsmith.verify.precomputed_inspect import inspect_precomputed

    if preset is not None:
        _fail(f"--preset {preset}: {dataset} is a .precomputed/ tree, which no FastGen preset reads; register it "
              "without --preset (it prints the LTX trainer's data section)")
    if sets:
        _fail("--set: a .precomputed/ tree has no loader overrides; set batch size and workers in the LTX config")
    from shardsmith.formats.precomputed import MODE_KEY, PRECOMPUTED_STAMP, mode_dirs
    from shardsmith.loaders.ltx import ltx_mode_section
    from shardsmith.progress import Progress
    from shardsmith.verify.precomputed_audio import read_stamp

    dirs = present_dirs(dataset)
    mode = read_stamp(dataset).get(MODE_KEY)  # the LTX training mode the build made the tree for
    rep = inspect_precomputed(dataset, progress=Progress())  # every .pt is read for its shape: a bar
    several = any(len(rep["dirs"][d]["shapes"]) > 1 for d in dirs if d.endswith("latents"))
    try:
        if mode is not None:  # the mode's folders, modalities and conditions
            snippet = ltx_mode_section(dataset, dirs, mode, f"from {PRECOMPUTED_STAMP}", several)
            dirs = mode_dirs(mode)
        else:
            snippet = ltx_data_section(dataset, dirs, several)
    except ValueError as exc:
        _fail(str(exc))
    path, root = portable_path(dataset, root_env)
    cfg_file = config_path(config)
    add_entry(cfg_file, name, {"kind": "precomputed", "path": path, "dirs": dirs}, replace=replace)
    typer.echo(f"registered {name!r} in {cfg_file}: .precomputed/ tree {path} ({', '.join(dirs)})")
    if not root:
        _absolute_note(dataset, path, root_env)
    for line in rep["problems"]:
        typer.echo(f"warning: {line} (shardsmith inspect {dataset})")
    typer.echo(f"\n# Python: from shardsmith.loaders import from_config; dataset = from_config({name!r})")
    typer.echo(snippet)


def _build_folder_arg(path: Path, command_name: str, takes: str) -> None:
    """Refuse, before any heavy import, a build-folder argument that does not exist, or that is a folder
    (or file) inside a build: naming the build folder to pass instead."""
    _must_exist(path, takes)
    from shardsmith.formats.build_dir import MANIFEST_FILE
    from shardsmith.formats.detect import enclosing_build

    if path.is_dir() and (path / MANIFEST_FILE).is_file():
        return
    found = enclosing_build(resolve_user_path(path).parent)  # (at any depth: holdout/deep/er/wds)
    if found is not None and found.has_manifest:
        _fail(f"{path} lies inside the shardsmith build {found.root} (one of its outputs), not a build folder; "
              f"{command_name} takes the build folder: pass {found.root} instead")


def _check_decode_out(out: Path) -> None:
    """``decode --out`` under a file, or in a folder this user may not look into or write in: refused before torch
    is imported (:mod:`shardsmith.user_paths`; decode checks it again). An ``--out`` that is a file is left to
    decode, which says what it is (a source of the build, or a file where a folder is needed)."""
    where = Path(os.path.abspath(os.path.expanduser(out)))
    folder = nearest_folder(where.parent, out, "--out")
    if folder == where.parent and os.path.lexists(where):
        if not where.is_dir():
            return
        folder = nearest_folder(where, out, "--out")
    check_writable(folder, out, "--out")


@command("decode")
def decode_cmd(
    build_dir: Path = typer.Argument(..., help="A shardsmith build folder (the --out of a build with latents)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for the decoded PNG/MP4 (and WAV) files and the "
                             "report."),
    output: Optional[str] = typer.Option(None, help="Which latent output (default: the first)."),
    split: str = typer.Option("train"),
    limit: Optional[int] = typer.Option(None, min=1, help="Decode at most this many samples."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an earlier decode in --out (only the files "
                                   "it wrote; a folder with other files is refused)."),
    device: str = typer.Option("auto", help="auto (the GPU when there is one), cuda or cpu."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
):
    """Decode cached latents back to PNG/MP4 with the recorded VAE (audio latents to WAV with the recorded audio
    VAE); report round-trip PSNR."""
    if device not in ("auto", "cuda", "cpu"):
        _fail(f"--device {device!r}: use auto, cuda or cpu")
    _build_folder_arg(build_dir, "decode", "decode takes a shardsmith build folder (the --out of a build with "
                      "latents)")
    _check_decode_out(out)
    from shardsmith.progress import Progress
    from shardsmith.verify.decode import decode, format_damaged  # (torch and the VAE code: after the cheap checks)

    rep = decode(build_dir, out, output=output, split=split, limit=limit, overwrite=overwrite, device=device,
                 progress=Progress(quiet=quiet))
    audio = rep.get("audio")
    if rep["samples"] or audio is None:
        typer.echo(f"decoded {rep['samples']} sample(s) of {rep['output']}/{rep['split']} into {out}; "
                   f"mean round-trip PSNR {rep['mean_psnr_db']} dB")
    if rep["note"]:
        typer.echo(f"note: {rep['note']}")
    if audio is not None:
        typer.echo(f"decoded {audio['wavs']} WAV(s) of {rep['output']}/{rep['split']} at {audio['rate']} Hz "
                   f"(stereo, 16-bit) into {out}")
        if audio["note"]:
            typer.echo(f"note: {audio['note']}")
    damaged = format_damaged(rep)
    if damaged:  # (what could be read is decoded; the damage is said, and the exit code is 1, as verify's)
        typer.echo(damaged, err=True)
        raise typer.Exit(1)


@command("report")
def report_cmd(
    build_dir: Path = typer.Argument(..., metavar="OUT", help="A finished shardsmith build folder (a build's --out)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Where to write the page "
                                          "(default: OUT/report.html)."),
    no_previews: bool = typer.Option(False, "--no-previews", help="Do not decode latents into previews "
                                     "(loads no VAE)."),
):
    """Write one self-contained HTML page about a build: counts and reasons, sample thumbnails and
    decoded latent previews, histograms, the last verify."""
    from shardsmith.report_html import write_report

    dest = write_report(build_dir, output, previews=not no_previews)
    typer.echo(f"report: {dest}")
