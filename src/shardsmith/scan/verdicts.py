"""What the scan figures mean for a build and for training: warnings and the enough-data verdict.

Contract: :func:`data_warnings` turns the report's sections into warnings (undeclared licences,
problems, duplicates, items no output of the recipe takes, items an output other than an image output
would skip (too short for every bucket, no caption ...), images below ``images.min_size``, classes without a
usable image), in that order. :func:`enough_data` compares the distinct usable training
samples with the samples a training run sees, ``batch x grad_accum x world x updates`` (the effective
batch, per-device batch times gradient-accumulation steps times devices, times the optimizer updates;
when batch and updates are given): the repetition factor, and the updates after which every sample has
been seen ``max_repeat`` times; more than ``max_repeat`` views of each is memorisation; fewer than
``TINY`` unique samples validates plumbing only.
"""

from __future__ import annotations

import math
from typing import Any

from shardsmith.errors import UserError

MAX_REPEAT_DEFAULT = 20.0
TINY = 1000


class TrainingFigureError(UserError):
    """A training figure of the enough-data estimate (batch, updates, ...) that no training run has."""


def check_training_figures(batch: int | None, updates: int | None, max_repeat: float, grad_accum: int = 1,
                           world: int = 1) -> None:
    """Refuse, before any probing, a figure the estimate cannot use: ``batch``, ``updates``,
    ``grad_accum`` and ``world`` are counts of at least 1 (None: not given), ``max_repeat`` is above 0.
    The command line checks the same when it parses the flags; this is the API's check."""
    for name, value in (("batch", batch), ("updates", updates), ("grad_accum", grad_accum), ("world", world)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise TrainingFigureError(f"scan {name}={value!r}: give a whole number of at least 1 "
                                      f"(--{name.replace('_', '-')} 1 or more)")
    if not (isinstance(max_repeat, (int, float)) and max_repeat > 0):
        raise TrainingFigureError(f"scan max_repeat={max_repeat!r}: give a number above 0, e.g. "
                                  f"{MAX_REPEAT_DEFAULT:g} (--max-repeat)")


#: the formats whose skips have warnings of their own (images below min_size, unlabelled images of a ZIP)
IMAGE_FORMATS = ("wds", "zip", "latent_zip")
#: skip reasons said elsewhere: an item of a kind the output does not take, a split it does not write, a copy
_SAID_ELSEWHERE = ("unsupported_kind_", "holdout", "duplicate")


def data_warnings(report: dict[str, Any]) -> list[str]:
    out: list[str] = []
    srcs, licenses = report["sources"], report["licenses"]
    undeclared = [n for n, s in srcs.items() if not s["license"]]
    if undeclared:
        out.append(f"{licenses.get('undeclared', 0)} item(s) have no declared licence (source(s) "
                   f"{', '.join(undeclared)}): check the terms and set sources[].license "
                   "(or --license) before training on or sharing a dataset built from them")
    problems, counts = report["problems"], report["problem_counts"]
    if problems:
        by = ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        out.append(f"{len(problems)} item(s) cannot be used ({by}); see problems for each file and the fix")
    dup = report["duplicates"]
    if dup["duplicate_items"]:
        what = "only the first copy is used" if dup["dedup"] else "all copies are kept (split.dedup is off)"
        out.append(f"{dup['duplicate_items']} item(s) are exact copies of others ({len(dup['groups'])} group(s)); "
                   f"{what}")
    others = report.get("not_taken") or {}
    if others:
        out.append(f"{sum(others.values())} item(s) that no output of the recipe takes "
                   f"({', '.join(f'{k} {v}' for k, v in others.items())}): a build skips them "
                   f"({', '.join(f'skipped:unsupported_kind_{k}' for k in others)}); limit the sources, or add an "
                   "output that writes them")
    said: dict[tuple, list[str]] = {}  # outputs that skip the same items alike share one warning
    for name, x in (report.get("outputs") or {}).items():
        if x["format"] in IMAGE_FORMATS:
            continue
        skips = {k: v for k, v in x["counts"]["skipped"].items() if not k.startswith(_SAID_ELSEWHERE)}
        if skips:
            key = tuple(sorted(skips.items(), key=lambda kv: (-kv[1], kv[0])))
            said.setdefault(key, []).append(name)
    table = (report.get("buckets") or {}).get("output")
    for key, names in said.items():
        by = ", ".join(f"{k} {v}" for k, v in key)
        where = "the buckets table" if table in names else "the outputs section"
        out.append(f"output{'s' if len(names) > 1 else ''} {', '.join(names)}: {sum(v for _, v in key)} item(s) "
                   f"would be skipped ({by}); see {where} for each item")
    im = report["images"]
    if im["below_min_size"]:
        out.append(f"{im['below_min_size']} image(s) have a shorter side below images.min_size={im['min_size']} "
                   "and would be skipped:too_small")
    for name in sorted(set(report["labels"] or ()) - set(report["labels_usable"] or ())):
        out.append(f"class {name!r} has no usable image; class-conditional loaders size labels as "
                   "max(label)+1, so fix or drop that class")
    return out


def enough_data(usable: int, holdout: int, unique: int, batch: int | None, updates: int | None,
                max_repeat: float, grad_accum: int = 1, world: int = 1) -> dict[str, Any]:
    """The report's ``enough_data`` section; its ``warnings`` are also the report's last ones."""
    enough: dict[str, Any] = {"usable": usable, "holdout": holdout, "unique": unique,
                              "batch": batch, "grad_accum": grad_accum, "world": world, "updates": updates,
                              "max_repeat": max_repeat}
    warn: list[str] = []
    if batch is not None:
        effective = batch * grad_accum * world
        enough["effective_batch"] = effective
        # the updates after which every sample has been seen max_repeat times (on average)
        enough["updates_to_max_repeat"] = math.ceil(max_repeat * unique / effective) if unique else None
    if batch is not None and updates is not None:
        seen = enough["effective_batch"] * updates
        enough["samples_seen"] = seen
        enough["repetition"] = round(seen / unique, 1) if unique else None
        if not unique:
            warn.append(f"no usable training samples for {seen:,} samples seen: nothing to train on")
        elif seen / unique > max_repeat:
            warn.append(f"each sample would be seen ~{seen / unique:,.1f} times (> max_repeat {max_repeat:g}): "
                        f"expect memorisation; add data or train at most {enough['updates_to_max_repeat']:,} "
                        "updates")
    if unique < TINY:
        warn.append(f"tiny dataset ({unique} unique training sample(s)): validates plumbing only, not model quality")
    enough["warnings"] = warn
    return enough
