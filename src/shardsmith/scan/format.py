"""The scan report as plain, aligned text; and :func:`human_bytes`.

Contract: :func:`format_scan` renders any report :func:`shardsmith.scan.scan` returns (sections,
histogram bars with counts, at most ``MAX_PROBLEM_LINES`` problems and 20 duplicate groups,
every warning); it reads only the report.
"""

from __future__ import annotations

MAX_PROBLEM_LINES = 50


def human_bytes(n: float | None) -> str:
    """``123 B``, ``1.5 KiB`` ... ``2.0 TiB``; ``-`` for None."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _bar(n: int, top: int, width: int = 30) -> str:
    if not n or not top:
        return ""
    return "#" * max(1, round(width * n / top))


def _table(rows: list[list[str]], indent: str = "  ", right: set[int] = frozenset()) -> list[str]:
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def _hist(title: str, hist: dict[str, int]) -> list[str]:
    top = max(hist.values(), default=0)
    lab = max((len(k) for k in hist), default=0)
    num = max((len(str(v)) for v in hist.values()), default=1)
    return [f"  {title}"] + [f"    {k.ljust(lab)}  {str(v).rjust(num)}  {_bar(v, top)}".rstrip()
                             for k, v in hist.items()]


def _counts(d: dict[str, int] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (d or {}).items()) or "-"


def _stats_line(name: str, st: dict, unit: str = "") -> str:
    f = (lambda v: "-" if v is None else f"{v:g}{unit}")
    return f"  {name}: min {f(st['min'])}, median {f(st['median'])}, max {f(st['max'])}"


def _media_sections(report: dict) -> list[str]:
    """The videos, audio and bucket-fit sections (empty when the scan met no clip)."""
    L: list[str] = []
    v = report.get("videos") or {}
    if v.get("count") or v.get("unreadable"):
        sampled = f"; {v['sampled_out']} more not probed (a deterministic sample)" if v.get("sampled_out") else ""
        L += ["", f"videos ({v.get('count', 0)} probed, {v.get('unreadable', 0)} unreadable{sampled})"]
        if v.get("count"):
            L += _hist("frames", v["frames"])
            L += _hist("fps", v["fps"])
            L += _hist("duration", v["duration"])
            L += _hist("resolution (w x h)", v["resolution"])
            L += [_stats_line("frames", v["frames_stats"]), _stats_line("fps", v["fps_stats"]),
                  _stats_line("duration", v["duration_stats"], "s"),
                  f"  with an audio track: {v['with_audio']}; rotated: {v['rotated']}"]
    a = report.get("audio") or {}
    if a.get("count") or a.get("unreadable"):
        L += ["", f"audio ({a.get('files', 0)} file(s), {a.get('tracks', 0)} clip track(s), "
                  f"{a.get('unreadable', 0)} unreadable)"]
        if a.get("count"):
            L += _hist("sample rate (Hz)", a["sample_rate"])
            L += _hist("channels", a["channels"])
            L += _hist("duration", a["duration"])
    b = report.get("buckets")
    if b:
        fitted = sum(x["count"] for x in b["buckets"].values())
        of = f" in output {b['output']}" if b.get("output") else ""
        L += ["", f"buckets ({fitted} item(s) fit{of}, {sum(x['count'] for x in b['skipped'].values())} skipped"
                  + (f"; of a sample, {b['sampled_out']} clip(s) not probed" if b.get("sampled_out") else "") + ")"]
        kinds = [k for k in ("videos", "images", "audio") if any(x.get(k) for x in b["buckets"].values())] \
            or ["videos", "images"]
        rows = [["bucket", "items", *kinds, "examples"]]
        for name, x in b["buckets"].items():
            ex = ", ".join(x["items"][:3]) + (" ..." if x["count"] > 3 else "")
            rows.append([name, str(x["count"]), *(str(x.get(k, 0)) for k in kinds), ex])
        L += _table(rows, right=set(range(1, len(kinds) + 2)))
        for status, x in b["skipped"].items():
            L.append(f"  {status}: {x['count']}: " + ", ".join(x["items"][:5]) + (" ..." if x["count"] > 5 else ""))
            if x.get("detail"):
                L.append(f"      e.g. {x['detail']}")
    return L


def _outputs_section(report: dict) -> list[str]:
    """Per output, the counts a build of the recipe would record (``inputs = written + skipped + failed``)."""
    outs = report.get("outputs") or {}
    if not outs:
        return []
    L = ["", "outputs (what a build would write)"]
    for name, x in outs.items():
        c = x["counts"]
        skipped, failed = sum(c["skipped"].values()), sum(c["failed"].values())
        L.append(f"  {name} ({x['format']}): inputs {c['inputs']} = written {c['written']} + skipped {skipped} "
                 f"+ failed {failed}" + (f"; {x['not_probed']} clip(s) not probed" if x.get("not_probed") else ""))
        for kind in ("skipped", "failed"):
            for reason, n in sorted(c[kind].items(), key=lambda kv: (-kv[1], kv[0])):
                ex = c.get("examples", {}).get(f"{kind}:{reason}", {})
                ids = ex.get("ids", [])
                L.append(f"    {kind}:{reason} x{n}" + (f"  e.g. {', '.join(ids[:3])}" if ids else ""))
    return L


def _usable_word(report: dict) -> str:
    """``image`` when every output writes images only (wds, zip, latent_zip), else ``item``."""
    outs = report.get("outputs")
    if outs is None:
        return "item" if report.get("buckets") else "image"
    return "image" if outs and all(x["format"] in ("wds", "zip", "latent_zip") for x in outs.values()) else "item"


def _latent_notes(name: str, e: dict) -> list[str]:
    vae, text = e["vae"], e.get("text")
    out = [f"  {name}: VAE {vae['family']} ({vae['channels']} ch, {vae['spatial']}x spatial, {vae['temporal']}x "
           f"temporal), latents {e['latent_dtype']}"
           + (f"; text {text['family']} {text['max_length']} x {text['dim']} {text['dtype']}" if text else "")]
    for bucket, x in e["buckets"].items():
        out.append(f"    {bucket}: {x['items']} x [{', '.join(str(d) for d in x['latent_shape'])}] "
                   f"~{human_bytes(x['per_sample_bytes'])} each = {human_bytes(x['bytes'])}")
    out += [f"    {p}" for p in e.get("partial", [])]
    if e.get("scaled"):
        out.append(f"    scaled: {e['scaled']}")
    return out


def format_scan(report: dict) -> str:
    """The scan report as plain, aligned text (sections, histogram bars with counts)."""
    L: list[str] = []
    srcs = report.get("sources", {})
    clips = (report.get("videos") or {}).get("count", 0)
    L.append(f"scan: {len(srcs)} source(s), {report.get('items', 0)} item(s), {human_bytes(report.get('bytes', 0))}; "
             f"{report.get('usable', 0)} usable {_usable_word(report)}(s)"
             + (f", {clips} probed clip(s)" if clips else ""))

    L += ["", "sources"]
    rows = [["name", "kind", "items", "bytes", "licence", "origin", "labels", "path"]]
    for name, s in srcs.items():
        rows.append([name, s["kind"], str(s["items"]), human_bytes(s["bytes"]), s["license"] or "UNDECLARED",
                     s["origin"] or "-", str(len(s["labels"])) if s["labels"] else "-", s["path"]])
    L += _table(rows, right={2, 3})

    L += ["", "licences"]
    L += _table([[k, str(v)] for k, v in report.get("licenses", {}).items()], right={1})
    if "undeclared" in report.get("licenses", {}):
        L.append(f"  WARNING: {report['licenses']['undeclared']} item(s) have no declared licence")

    L += ["", "media kinds"]
    L += _table([[k, str(v)] for k, v in report.get("kinds", {}).items()], right={1})

    im = report.get("images", {})
    L += ["", f"images ({im.get('count', 0)} decoded)"]
    if im.get("count"):
        L += _hist("shorter side (px)", im["short_side"])
        L += _hist("aspect ratio (w/h)", im["aspect"])
        L += _table([["", "min", "median", "max"],
                     ["width", *(str(im["width"][k]) for k in ("min", "median", "max"))],
                     ["height", *(str(im["height"][k]) for k in ("min", "median", "max"))]],
                    indent="    ", right={1, 2, 3})
        L.append(f"  modes:   {_counts(im['modes'])}")
        L.append(f"  formats: {_counts(im['formats'])}")
        L.append(f"  decode notes: {_counts(im['notes'])}")
        if im.get("min_size"):
            L.append(f"  below images.min_size={im['min_size']}: {im['below_min_size']}")

    L += _media_sections(report)

    labels = report.get("labels")
    if labels:
        usable = report.get("labels_usable") or {}
        L += ["", f"labels ({len(labels)} classes)"]
        top = max(usable.values(), default=0)
        L += _table([["class", "items", "usable", ""]] +
                    [[k, str(v), str(usable.get(k, 0)), _bar(usable.get(k, 0), top)] for k, v in labels.items()],
                    right={1, 2})

    cap = report.get("captions", {})
    L += ["", "captions",
          f"  with caption: {cap.get('with_caption', 0)} (empty: {cap.get('empty', 0)}); "
          f"without: {cap.get('without', 0)}"]

    L += _outputs_section(report)

    probs = report.get("problems", [])
    L += ["", f"problems ({len(probs)})"]
    if probs:
        L += _table([[k, str(v)] for k, v in report.get("problem_counts", {}).items()], right={1})
        L.append("")
        for p in probs[:MAX_PROBLEM_LINES]:
            L.append(f"  {p['status']}  {p['id']}")
            if p.get("detail"):
                L.append(f"      {p['detail']}")
        if len(probs) > MAX_PROBLEM_LINES:
            L.append(f"  ... and {len(probs) - MAX_PROBLEM_LINES} more (see --json)")
    else:
        L.append("  none")

    dup = report.get("duplicates", {})
    groups = dup.get("groups", [])
    L += ["", f"exact duplicates ({len(groups)} group(s), {dup.get('duplicate_items', 0)} extra copies)"]
    for g in groups[:20]:
        L.append(f"  {human_bytes(g['bytes'])}  {g['sha256'][:12]}  " + ", ".join(g["items"]))
    if len(groups) > 20:
        L.append(f"  ... and {len(groups) - 20} more groups (see --json)")

    est = report.get("estimate", {})
    L += ["", "estimated output size"]
    rows = [["output", "format", "samples", "per sample", "total", "sampled"]]
    notes = []
    for name, e in est.items():
        if "not_estimated" in e:
            notes.append(f"  {name} ({e['format']}): not estimated: {e['not_estimated']}")
            continue
        if "buckets" in e:  # a latent output: from the buckets and the VAE's compression
            per = e["bytes"] / e["samples"] if e["samples"] else 0
            rows.append([name, e["format"], str(e["samples"]), human_bytes(round(per)), e["human"], "from buckets"])
            notes += _latent_notes(name, e)
            continue
        rows.append([name, e["format"], str(e["samples"]), human_bytes(e["per_sample_bytes"]), e["human"],
                     f"{e['written_in_sample']}/{e['sampled']} written"])
        notes += [f"  {name}: {p}" for p in e.get("partial", [])]
    L += _table(rows, right={2, 3, 4}) + notes

    en = report.get("enough_data", {})
    L += ["", "enough data?",
          f"  usable {en.get('usable', 0)} = train {en.get('usable', 0) - en.get('holdout', 0)} "
          f"+ holdout {en.get('holdout', 0)}; unique training samples: {en.get('unique', 0)}"]
    if en.get("samples_seen") is not None:
        rep = en.get("repetition")
        L.append(f"  batch {en['batch']} x grad-accum {en.get('grad_accum', 1)} x world {en.get('world', 1)} = "
                 f"effective batch {en['effective_batch']:,}; x updates {en['updates']:,} = "
                 f"{en['samples_seen']:,} samples seen; repetition "
                 f"{'- (no unique samples)' if rep is None else f'{rep:,.1f}x'} (max_repeat {en['max_repeat']:g})")
    if en.get("updates_to_max_repeat") is not None:
        L.append(f"  every sample seen {en['max_repeat']:g} times after {en['updates_to_max_repeat']:,} updates "
                 f"at effective batch {en['effective_batch']:,}")

    warns = report.get("warnings", [])
    L += ["", f"warnings ({len(warns)})"]
    L += [f"  warning: {w}" for w in warns] or ["  none"]
    return "\n".join(L)
