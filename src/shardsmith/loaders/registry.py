"""Data-config registry: named datasets in a YAML file, with paths through an environment root.

An entry looks like::

    quickstart:
      preset: image
      path: ${DATA_ROOT_DIR}/quickstart/wds
      overrides: {batch_size: 16}

so the file moves between machines: only ``DATA_ROOT_DIR`` changes. The file is
``--config``, else ``$SHARDSMITH_DATA_CONFIG``, else ``~/.config/shardsmith/data.yaml``.
Writes are atomic and never drop other entries, nor the file's comments and layout (the entry
is added as text, see :func:`add_entry`); a symlinked file is written through to its target.
Re-registering a name with a different entry is refused unless ``replace``.

Only a file that is recognisably such a data config is edited: a new or empty file, or a mapping whose
top-level values are dataset entries (a mapping with ``path:`` and ``preset:``, or ``kind: precomputed``,
``path:`` and ``dirs:``, as ``register`` writes them and ``from_config`` loads them); a value that other
entries reuse through a YAML alias (``_defaults: &d``, then ``<<: *d``) is no entry and is left alone. A
YAML mapping without any entry (a trainer's config, a recipe, another tool's settings) is refused,
untouched, naming the file and a key that is no entry; a data config with a broken entry (``presett:``) is
refused naming that entry and the fix, except the entry ``--replace`` rewrites: that is how it is fixed
(:func:`check_config`).
"""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path
from typing import Any

import yaml

from shardsmith.atomic import atomic_write_bytes
from shardsmith.errors import UserError
from shardsmith.user_paths import resolve_user_path

DEFAULT_ENV = "DATA_ROOT_DIR"


class RegistryError(UserError, ValueError):
    """A bad name, a clash with an existing entry, an unresolvable path, or a data-config file that
    cannot be read or written (one ``error:`` line, exit 2)."""


def config_path(explicit: str | os.PathLike | None = None) -> Path:
    if explicit:
        return Path(explicit)
    env = os.environ.get("SHARDSMITH_DATA_CONFIG")
    return Path(env) if env else Path.home() / ".config" / "shardsmith" / "data.yaml"


def _read_text(path: Path) -> str | None:
    """The text of the data config at ``path`` (None when there is none), or :class:`RegistryError`."""
    if path.is_dir():
        raise RegistryError(f"data config {path} is a folder; give a YAML file (--config {path / 'data.yaml'})")
    if not path.exists():
        return None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RegistryError(f"data config {path} is not UTF-8 text (not a YAML file?); pass another --config") from None
    except OSError as exc:
        raise RegistryError(f"cannot read data config {path}: {exc.strerror or exc}; pass another --config") from None


def _parse(path: Path, text: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RegistryError(f"data config {path} is not valid YAML{where}: {what}; fix it, or pass another "
                            "--config") from None
    if not isinstance(data, dict):
        raise RegistryError(f"{path} must hold a mapping of dataset names to entries")
    return data


def _is_entry(value: Any) -> bool:
    """Whether ``value`` is a dataset entry ``from_config`` loads (``loaders.presets.from_config``: what
    :func:`add_entry` writes): a mapping with a ``path`` string and either a ``preset`` string (with
    ``overrides``, when there, a mapping) or ``kind: precomputed`` with its ``dirs`` list."""
    if not isinstance(value, dict) or not isinstance(value.get("path"), str):
        return False
    if value.get("kind") == "precomputed":
        return isinstance(value.get("dirs"), list)
    return isinstance(value.get("preset"), str) and isinstance(value.get("overrides", {}), dict)


def _anchor_holders(text: str) -> set[str]:
    """The top-level keys whose value other values reuse through a YAML alias (``_defaults: &d {...}`` then
    ``a: {<<: *d, path: ...}``): holders of shared settings, which ``from_config`` never loads as a dataset
    (it reads only the entry it is asked for, with the merge resolved)."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return set()
    if not isinstance(root, yaml.MappingNode):
        return set()
    tops = {id(v): k.value for k, v in root.value if isinstance(k, yaml.ScalarNode)}
    held: set[str] = set()
    for _, value in root.value:
        seen: set[int] = set()
        stack = [n for pair in value.value for n in pair] if isinstance(value, yaml.MappingNode) else \
            list(value.value) if isinstance(value, yaml.SequenceNode) else []
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if id(node) in tops:
                held.add(tops[id(node)])
            if isinstance(node, yaml.MappingNode):
                stack += [n for pair in node.value for n in pair]
            elif isinstance(node, yaml.SequenceNode):
                stack += list(node.value)
    return held


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        keys = [str(k) for k in value]
        return f"a mapping of {', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''}" if keys else "empty"
    return "a list" if isinstance(value, list) else repr(value)


_ENTRY = ("a mapping with preset: and path:, or kind: precomputed, path: and dirs:, as shardsmith register "
          "writes them")


def _check_entries(path: Path, data: dict[str, Any], text: str, replacing: str | None = None) -> None:
    """Refuse (:class:`RegistryError`) a parsed file ``register`` must not edit. Values other values reuse
    through a YAML alias (:func:`_anchor_holders`) and the entry ``replacing`` (``--replace`` rewrites it:
    a broken one is how it is fixed) are left aside. Of the rest, when none is a dataset entry (and there
    is something), the file is someone else's YAML (a trainer's config, a recipe): refused as no data
    config. When some are entries, it is a data config: a value that is none is named as a broken entry
    to fix (or ``--replace``)."""
    holders = _anchor_holders(text)
    rest = {k: v for k, v in data.items() if k != replacing and str(k) not in holders}
    bad = [(k, v) for k, v in rest.items() if not _is_entry(v)]
    if not bad:
        return
    key, value = bad[0]
    if len(bad) == len(rest):  # no entry at all: another program's file
        recipe = " (it looks like a shardsmith build recipe)" if {"sources", "outputs"} & set(data) else ""
        raise RegistryError(
            f"{path} is not a shardsmith data config{recipe}: its top-level key {key!r} ({_shown(value)}) is no "
            f"dataset entry ({_ENTRY}), so register leaves that file alone; pass --config a data-config file of "
            "such entries, or a new file name (e.g. --config datasets.yaml)")
    more = f" (and {len(bad) - 1} more: {', '.join(repr(k) for k, _ in bad[1:4])})" if len(bad) > 1 else ""
    raise RegistryError(
        f"{path} is a data config whose entry {key!r} ({_shown(value)}) is broken{more}: it is no dataset entry "
        f"({_ENTRY}), so from_config cannot load it and register leaves the file alone; fix or remove that entry "
        f"in {path}, or re-register it: shardsmith register DATASET --name {key} --replace --config {path}")


def check_config(path: Path, replacing: str | None = None) -> None:
    """Refuse (:class:`RegistryError`) a data config that cannot be read, is no YAML mapping, or is not a
    data config or holds a broken entry (see :func:`_check_entries`; ``replacing``: the name ``--replace``
    rewrites); a file that does not exist yet is fine (it is created)."""
    text = _read_text(path)
    if text is not None:
        _check_entries(path, _parse(path, text), text, replacing)


def read_config(path: Path) -> dict[str, Any]:
    text = _read_text(path)
    return {} if text is None else _parse(path, text)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env_name(root_env: str, flag: str = "root_env") -> None:
    """Refuse (:class:`RegistryError`) a ``root_env`` that is no shell variable name (``export NAME=...`` and
    ``${NAME}`` would not work with it)."""
    if not isinstance(root_env, str) or not _ENV_NAME.fullmatch(root_env):
        raise RegistryError(f"{flag} {root_env!r} is not an environment variable name a shell can export (letters, "
                            f"digits and '_', not starting with a digit); pass e.g. {flag} {DEFAULT_ENV}")


def portable_path(dataset: Path, root_env: str = DEFAULT_ENV) -> tuple[str, str]:
    """(path written in the config, root): ``${ENV}/rel`` when the variable ``root_env`` is set and the
    dataset (resolved through its symlinks) lies under it (root: the variable's folder); when it is unset,
    the dataset's resolved absolute path (root: ''), which names that dataset and no other: a root guessed
    from the dataset's own folder would write ``${ENV}/wds`` for every build's ``wds`` output, and one
    name would load another build's data. A dataset outside a set root, or a ``root_env`` that is no
    variable name, is a :class:`RegistryError`. :func:`suggested_root` is the root to export for a
    portable entry."""
    check_env_name(root_env)
    dataset = resolve_user_path(dataset)
    root = os.environ.get(root_env)
    if not root:
        return dataset.as_posix(), ""
    root_path = resolve_user_path(root, f"${root_env}")
    if not dataset.is_relative_to(root_path):
        raise RegistryError(f"{dataset} is not under ${root_env}={root_path}; move it there or set {root_env} "
                            "to a folder that contains it")
    rel = dataset.relative_to(root_path).as_posix()
    return (f"${{{root_env}}}/{rel}" if rel != "." else f"${{{root_env}}}"), str(root_path)


def suggested_root(dataset: Path) -> Path:
    """A root to export for a portable entry of ``dataset``: the folder that holds the shardsmith build
    it belongs to (the entry then reads ``${ENV}/<build>/<output>``, naming the build), else the
    dataset's parent folder."""
    from shardsmith.formats.detect import enclosing_build

    dataset = resolve_user_path(dataset)
    found = enclosing_build(dataset.parent)
    return found.root.parent if found is not None else dataset.parent


def entry_target(entry: Any) -> Path | None:
    """The absolute folder an entry's ``path`` names now (its variables expanded), or None when it
    cannot be told (a variable that is not set, no path)."""
    path = entry.get("path") if isinstance(entry, dict) else None
    if not isinstance(path, str):
        return None
    expanded = os.path.expandvars(os.path.expanduser(path))
    if "$" in expanded:
        return None
    return Path(os.path.abspath(expanded))


def resolve(path: str) -> Path:
    expanded = os.path.expandvars(path)
    if "$" in expanded:
        raise RegistryError(f"{path!r} names an environment variable that is not set; export it first")
    return Path(expanded)


def _last_end(node: yaml.Node) -> int:
    """Offset just past the last character of ``node``'s own text (a block collection's end mark lies
    at the next token, past any comment lines that follow it: those stay)."""
    if isinstance(node, yaml.ScalarNode) or getattr(node, "flow_style", False):
        return node.end_mark.index
    kids = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
    return max((_last_end(k) for k in kids), default=node.end_mark.index)


def _edited(text: str, name: str, entry: dict[str, Any]) -> str:
    """``text`` with the entry ``name`` added at the end, or its text replaced in place: every other
    line (comments, order, layout) stays as the user wrote it."""
    block = yaml.safe_dump({name: entry}, sort_keys=False, allow_unicode=True)
    root = yaml.compose(text)
    for key, value in root.value if isinstance(root, yaml.MappingNode) else []:
        if isinstance(key, yaml.ScalarNode) and key.value == name:
            start, end = key.start_mark.index, _last_end(value)
            line_end = text.find("\n", end)
            end = len(text) if line_end < 0 else line_end + 1
            return text[:start] + block + text[end:]
    return text + ("" if not text or text.endswith("\n") else "\n") + block


def config_var(name: str) -> str:
    """The Python name of dataset ``name``'s FastGen config in the snippet ``register`` prints:
    ``my-data`` -> ``MY_DATA_Loader_Config``; a name that starts with a digit (``2024-photos``, ``1e3``) is
    prefixed ``DS_`` (``DS_2024_PHOTOS_Loader_Config``), and a character no identifier holds is ``_``, so the
    snippet is always valid Python. Spelled as Python reads it (NFKC). Names that differ only in ``-`` / ``_``
    or letter case share one; :func:`add_entry` refuses a second such name in one data config."""
    base = "".join(c if c == "_" or f"x{c}".isidentifier() else "_" for c in name.upper())
    if not base[:1].isidentifier():  # a digit first (or a character only allowed later)
        base = f"DS_{base}"
    return unicodedata.normalize("NFKC", f"{base}_Loader_Config")


def add_entry(path: Path, name: str, entry: dict[str, Any], *, replace: bool = False) -> None:
    """Add (or, with ``replace``, replace) the entry ``name`` of the data config at ``path``. The file
    is edited as text: the new entry is appended (a replaced one rewritten where it stands), so its
    comments, order and layout stay; it is written atomically next to the real file (through a
    symlink: the link stays, its target gets the entry). An entry that is already there as given
    writes nothing. When the edit would not give back exactly the old entries plus this one (a
    layout the text edit cannot handle, e.g. a flow mapping ``{...}`` at the top), a file without
    comments is rewritten whole; one with comments is left alone and the refusal says to add the
    entry by hand. A file that is not a data config (:func:`check_config`) is refused untouched."""
    if not name or not all(c.isalnum() or c in "_-" for c in name):
        raise RegistryError(f"dataset name {name!r} must be letters, digits, '_' or '-'")
    real = resolve_user_path(path, "data config")  # a symlinked config: write its target, keep the link
    if Path(path).is_symlink() and not real.parent.is_dir():
        raise RegistryError(f"data config {path} is a symlink to {os.readlink(path)}, whose folder {real.parent} "
                            "does not exist (it is not created through a link); fix the link or pass another --config")
    text = _read_text(path)
    data = {} if text is None else _parse(path, text)
    _check_entries(path, data, text or "", name if replace else None)  # someone else's YAML is never appended to
    var = config_var(name)
    # only entries with a FastGen config (a preset; not a .precomputed/ tree's) have a variable; a name already
    # there was registered before this check: re-registering it stays possible
    twin = None if name in data or "preset" not in entry else next(
        (n for n, e in data.items() if isinstance(n, str) and isinstance(e, dict) and "preset" in e
         and config_var(n) == var), None)
    if twin is not None:  # two entries pasted into one FastGen configs/data.py: the second redefines the first
        raise RegistryError(f"dataset name {name!r} gives the FastGen config variable {var}, which the entry "
                            f"{twin!r} in {path} already has (names that differ only in '-' / '_' or letter "
                            "case share one): pasted into one configs/data.py, one would silently redefine the "
                            "other; choose another --name")
    if name in data and data[name] != entry and not replace:
        raise RegistryError(f"{path} already has a different entry {name!r}: {data[name]}{_leads_to(data[name])}; "
                            f"this one is {entry}{_leads_to(entry)}; choose another --name or pass --replace")
    if name in data and data[name] == entry:
        return  # already registered as asked: the file is not touched
    want = {**data, name: entry}
    if not (text or "").strip():
        new = yaml.safe_dump(want, sort_keys=True, allow_unicode=True)
    else:
        try:
            new = _edited(text, name, entry)
            ok = yaml.safe_load(new) == want
        except yaml.YAMLError:
            ok = False
        if not ok and "#" not in text:  # nothing a rewrite could lose but the layout: rewrite it
            new, ok = yaml.safe_dump(want, sort_keys=True, allow_unicode=True), True
        if not ok:
            raise RegistryError(f"cannot add {name!r} to {path} without rewriting the whole file (its layout is "
                                "not a plain block mapping of names), which would lose its comments and layout; "
                                f"add this entry by hand:\n{yaml.safe_dump({name: entry}, sort_keys=False)}")
    try:
        atomic_write_bytes(real, new.encode("utf-8"))
    except OSError as exc:
        raise RegistryError(f"cannot write data config {real}: {exc.strerror or exc}; pass a --config you can "
                            "write (or make that folder writable)") from None


def _leads_to(entry: Any) -> str:
    """`` (the folder X)`` where an entry's path is written through a variable, else ''."""
    where = entry_target(entry)
    path = entry.get("path") if isinstance(entry, dict) else None
    if isinstance(path, str) and "$" in path:
        return f" (the folder {where})" if where is not None else " (its variable is not set now)"
    return ""


def get_entry(name: str, path: Path) -> dict[str, Any]:
    data = read_config(path)
    if name not in data:
        raise RegistryError(f"no dataset {name!r} in {path} (known: {sorted(data)}); "
                            "add it with `shardsmith register DATASET --preset P --name NAME`")
    return data[name]
