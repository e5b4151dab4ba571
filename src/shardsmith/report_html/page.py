"""The report as one self-contained HTML page: inline CSS, inline SVG plots, thumbnails as
``data:`` URIs, no script, and a Content-Security-Policy that lets the page load nothing from
anywhere (so a report can never reach the network). Every string that comes from the build
(ids, paths, captions, reasons, model names) goes through :func:`esc`."""

from __future__ import annotations

from html import escape
from typing import Any, Iterable

from shardsmith.report_html import svg
from shardsmith.report_html.gather import BuildData
from shardsmith.report_html.samples import SampleFacts, Sheet

RANDOM_LABEL = "random-weights: previews are meaningless"
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
TITLE_PREFIX = "shardsmith report: "
# every page this tool writes starts with these bytes: ``write_report`` overwrites an existing
# file only when it starts with them (a report written before), never anything else
PAGE_HEAD = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
             '<meta name="viewport" content="width=device-width, initial-scale=1">'
             f"<title>{TITLE_PREFIX}")

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1200px;
padding:16px 24px;color:#1d2433;background:#fff}
h1{font-size:22px;margin:8px 0}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d8dde6;padding-bottom:4px}
h3{font-size:15px;margin:16px 0 6px}
table{border-collapse:collapse;margin:6px 0 12px}td,th{border:1px solid #d8dde6;padding:3px 8px;text-align:left;
vertical-align:top}th{background:#f3f5f8}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#176c2f;font-weight:600}.bad{color:#a4161a;font-weight:600}.muted{color:#667085}
.warn{background:#fff6e0;border:1px solid #f0c36d;padding:6px 10px;margin:6px 0;border-radius:4px}
.random{background:#fde8e8;border:2px solid #a4161a;color:#a4161a;font-weight:700;padding:6px 10px;margin:6px 0;
border-radius:4px}
.sheet{display:flex;flex-wrap:wrap;gap:8px;margin:4px 0 12px}
figure{margin:0;width:136px}figure img{display:block;max-width:128px;max-height:128px;border:1px solid #d8dde6;
background:#f3f5f8}figcaption{font-size:11px;overflow-wrap:anywhere;color:#444}
.plots{display:flex;flex-wrap:wrap;gap:12px}.plot .bar{fill:#3b6fb6}.plot .ax{stroke:#667085}
.plot .pt{font-size:12px;fill:#1d2433}.plot .tl{font-size:10px;fill:#667085}
code{background:#f3f5f8;padding:0 3px;border-radius:3px}
"""


def esc(x: Any) -> str:
    """Any value as escaped HTML text (quotes too: safe in attributes)."""
    return escape("" if x is None else str(x), quote=True)


def _table(head: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    """A table of already-escaped cells."""
    h = "".join(f"<th>{c}</th>" for c in head)
    body = "".join("<tr>" + "".join(r) + "</tr>" for r in rows)
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _td(x: Any, num: bool = False, cls: str = "") -> str:
    classes = " ".join(c for c in ("n" if num else "", cls) if c)
    attr = f' class="{classes}"' if classes else ""
    return f"<td{attr}>{esc(x)}</td>"


def _n(block: dict[str, Any], kind: str) -> int:
    return sum((block.get(kind) or {}).values())


def counts_line(name: str, block: dict[str, Any]) -> str:
    """``all outputs: inputs 9 = written 8 + skipped 0 + failed 1`` (as the build's summary says it)."""
    return (f"{name}: inputs {block.get('inputs', 0)} = written {block.get('written', 0)} + skipped "
            f"{_n(block, 'skipped')} + failed {_n(block, 'failed')}")


def _counts(m: dict[str, Any]) -> str:
    parts = ['<h2 id="counts">Counts</h2>',
             f'<p class="count-line" data-output="*" data-split="*">{esc(counts_line("all outputs (per item)", m["counts"]))}</p>']
    rows = []
    reasons = []
    for name, o in m["outputs"].items():
        blocks = [("all", o.get("counts") or {})] + list((o.get("splits") or {}).items())
        for split, b in blocks:
            rows.append([_td(name), _td(o.get("format")), _td(split), _td(b.get("inputs", 0), True),
                         _td(b.get("written", 0), True), _td(_n(b, "skipped"), True), _td(_n(b, "failed"), True)])
            if split == "all":
                continue
            for kind in ("failed", "skipped"):
                for reason, n in sorted((b.get(kind) or {}).items()):
                    ex = (b.get("examples") or {}).get(f"{kind}:{reason}") or {}
                    ids = "".join(f"<li><code>{esc(i)}</code></li>" for i in (ex.get("ids") or [])[:5])
                    reasons.append([_td(name), _td(split), _td(f"{kind}:{reason}", cls="bad" if kind == "failed" else ""),
                                    _td(n, True), f"<td><ul class=\"ids\">{ids}</ul></td>", _td(ex.get("detail") or "")])
    parts.append(_table(["output", "format", "split", "inputs", "written", "skipped", "failed"], rows, "counts"))
    for name, o in m["outputs"].items():
        parts.append(f'<p class="count-line" data-output="{esc(name)}">{esc(counts_line(f"output {name}", o.get("counts") or {}))}</p>')
    parts.append('<h3 id="reasons">Skipped and failed: reasons and examples</h3>')
    if reasons:
        parts.append(_table(["output", "split", "status", "count", "example ids (up to 5)", "detail"], reasons,
                            "reasons"))
    else:
        parts.append('<p class="ok">nothing skipped or failed</p>')
    return "".join(parts)


def _sources(m: dict[str, Any]) -> str:
    rows = [[_td(s.get("name")), _td(s.get("kind")), _td(s.get("items"), True), _td(s.get("bytes"), True),
             _td(s.get("origin")), _td(s.get("license"))] for s in m.get("sources") or []]
    return '<h2 id="sources">Sources</h2>' + _table(["name", "kind", "items", "bytes", "origin", "licence"], rows)


def _models(m: dict[str, Any], random: bool) -> str:
    models = m.get("models")
    if not isinstance(models, dict):
        return ""
    rows = []
    for role in ("vae", "text"):
        d = models.get(role)
        if not isinstance(d, dict):
            continue
        prov, spec = d.get("provenance") or {}, d.get("spec") or {}
        w = prov.get("weights")
        rows.append([_td(role), _td(spec.get("family")), _td(prov.get("cls")), _td(w, cls="bad" if w == "random-weights" else ""),
                     _td(prov.get("path_or_repo") or prov.get("config_name")), _td(prov.get("revision"))])
    banner = f'<p class="random" id="random-weights">{esc(RANDOM_LABEL)} (the VAE has random weights: latents are ' \
             "for checking plumbing, not model-space data)</p>" if random else ""
    return '<h2 id="models">Models</h2>' + banner + _table(["role", "family", "class", "weights", "from", "revision"], rows)


def _buckets(m: dict[str, Any]) -> str:
    rows = []
    for name, o in m["outputs"].items():
        for split, files in (o.get("files") or {}).items():
            for bucket, b in ((files.get("buckets") or {}) if isinstance(files, dict) else {}).items():
                used = f"{b.get('frames_used')}/{b.get('frames_available')}" if b.get("frames_available") else ""
                kept = b.get("mean_area_kept")
                rows.append([_td(name), _td(split), _td(bucket), _td(b.get("samples"), True),
                             _td("x".join(map(str, b.get("latent_shape") or []))), _td(used, True),
                             _td(f"{kept:.0%}" if isinstance(kept, (int, float)) else "", True)])
    if not rows:
        return ""
    return ('<h3 id="buckets">Buckets</h3>' +
            _table(["output", "split", "bucket", "samples", "latent shape", "frames used", "area kept"], rows))


def _sheets(sheets: list[Sheet], random: bool) -> str:
    parts = ['<h2 id="samples">Samples</h2>']
    if not sheets:
        parts.append('<p class="muted">no samples to show</p>')
    for s in sheets:
        what = "decoded latent previews" if s.kind == "previews" else "thumbnails"
        head = f"{s.output} / {s.split}" + (f" / bucket {s.bucket}" if s.bucket else "") + f": {what}"
        parts.append(f'<h3 class="sheet-head">{esc(head)}</h3>')
        if s.kind == "previews" and random:
            parts.append(f'<p class="random">{esc(RANDOM_LABEL)}</p>')
        figs = []
        for t in s.thumbs:
            cap = f"<br>{esc(t.caption[:160])}" if t.caption else ""
            figs.append(f'<figure class="thumb"><img src="{esc(t.uri)}" alt="{esc(t.title)}" title="{esc(t.title)}">'
                        f"<figcaption><code>{esc(t.title)}</code>{cap}</figcaption></figure>")
        parts.append(f'<div class="sheet">{"".join(figs)}</div>' if figs else '<p class="muted">no thumbnails</p>')
        parts += [f'<p class="warn">{esc(n)}</p>' for n in s.notes[:10]]
    return "".join(parts)


def _teacher_preview(preview: dict[str, Any] | None) -> str:
    """``distill.preview``: the teacher's samples of a few training prompts, decoded before the run."""
    if not preview or not preview.get("pictures"):
        return ""
    import base64

    parts = ['<h2 id="teacher-preview">Teacher preview</h2>',
             '<p class="muted">the teacher on training prompts, decoded by models.vae, before the run</p>']
    if preview.get("meaningless"):
        parts.append(f'<p class="random">{esc(preview.get("why") or "random weights: the pictures are meaningless")}</p>')
    if preview.get("warning"):
        parts.append(f'<p class="warn">{esc(preview["warning"])}</p>')
    figs = [f'<figure class="thumb"><img src="data:image/png;base64,{base64.b64encode(p["png"]).decode()}" '
            f'alt="{esc(p.get("prompt"))}"><figcaption>{esc(str(p.get("prompt", ""))[:160])}<br>'
            f'<code>seed {esc(p.get("seed"))}</code></figcaption></figure>' for p in preview["pictures"]]
    parts.append(f'<div class="sheet">{"".join(figs)}</div>')
    return "".join(parts)


def _histograms(data: BuildData, facts: dict[str, SampleFacts]) -> str:
    plots, notes = [], []
    st = data.stats
    if st is not None:
        if st.sampled < st.total:
            notes.append(f"sizes from a sample of {st.sampled} of {st.total} usable items (every "
                         f"{-(-st.total // max(st.sampled, 1))}th)")
        plots += [svg.histogram("image width (px)", st.widths), svg.histogram("image height (px)", st.heights),
                  svg.histogram("aspect (width / height)", st.aspects)]
        if len(st.kinds) > 1:
            plots.append(svg.bars("items by kind", st.kinds))
        for key, vals in st.video.items():
            plots.append(svg.histogram(f"video {key} (item meta)", vals))
    buckets: dict[str, int] = {}
    for name, o in data.manifest["outputs"].items():
        for files in (o.get("files") or {}).values():
            for b, info in ((files.get("buckets") or {}) if isinstance(files, dict) else {}).items():
                buckets[f"{name}:{b}"] = buckets.get(f"{name}:{b}", 0) + int(info.get("samples") or 0)
    frames: list[float] = []
    fps: list[float] = []
    dur: list[float] = []
    for name, f in facts.items():
        frames += f.frames
        fps += f.fps
        dur += f.duration
        if not any(k.startswith(f"{name}:") for k in buckets):
            for b, n in f.buckets.items():
                buckets[f"{name}:{b} (sampled)"] = n
    plots += [svg.histogram("source frames (written samples)", frames), svg.histogram("source fps", fps),
              svg.histogram("source duration (s)", dur)]
    if buckets:
        plots.append(svg.bars("samples by bucket (output:bucket)", buckets))
    plots = [p for p in plots if p]
    body = "".join(f"<div>{p}</div>" for p in plots) or '<p class="muted">nothing to plot</p>'
    return ('<h2 id="histograms">Histograms</h2>' + "".join(f'<p class="muted">{esc(n)}</p>' for n in notes) +
            f'<div class="plots">{body}</div>')


def _verify(records: list[dict[str, Any]]) -> str:
    parts = ['<h2 id="verify">Last verify</h2>']
    if not records:
        parts.append('<p class="muted">no verify recorded for this build yet (run <code>shardsmith verify '
                     'DATASET</code> on one of its outputs)</p>')
        return "".join(parts)
    for doc in records:
        rep = doc.get("report") or {}
        ok = rep.get("ok")
        parts.append(f'<h3>{esc(doc.get("dataset_rel"))} (output {esc(doc.get("output"))}, split '
                     f'{esc(doc.get("split"))}) — <span class="{"ok" if ok else "bad"}">{"OK" if ok else "FAILED"}</span>'
                     f' <span class="muted">at {esc(doc.get("verified_at"))}, world {esc(rep.get("world"))} x '
                     f'workers {esc(rep.get("workers"))}, batch {esc(rep.get("batch_size"))}</span></h3>')
        rows = [[_td("PASS" if c.get("ok") else "FAIL", cls="ok" if c.get("ok") else "bad"), _td(c.get("name")),
                 _td(c.get("detail"))] for c in rep.get("checks") or [] if isinstance(c, dict)]
        parts.append(_table(["", "check", "detail"], rows))
        c = rep.get("contract") or {}
        keys = c.get("keys") if isinstance(c, dict) else None
        if isinstance(keys, dict) and keys:
            krows = []
            for key, st in keys.items():
                st = st if isinstance(st, dict) else {}
                shape = "x".join(map(str, st.get("shape") or [])) if st.get("type") == "tensor" else ""
                krows.append([_td(key), _td(st.get("type")), _td(st.get("dtype")), _td(shape),
                              _td(st.get("min", st.get("min_len")), True), _td(st.get("max", st.get("max_len")), True),
                              _td(st.get("mean"), True)])
            parts.append(f'<p>batch contract: {esc(c.get("batches"))} batches, {esc(c.get("samples"))} samples</p>')
            parts.append(_table(["key", "type", "dtype", "shape", "min", "max", "mean"], krows))
        for w in (rep.get("warnings") or [])[:10]:
            parts.append(f'<p class="warn">{esc(w)}</p>')
    return "".join(parts)


def render(data: BuildData, sheets: list[Sheet], facts: dict[str, SampleFacts], random: bool,
           notes: list[str]) -> str:
    m = data.manifest
    # nothing of where or when it was built: the same build gives the same page, byte for byte
    # (a resumed build's and an uninterrupted one's too)
    recipe_out = ", ".join(f"{n} ({o.get('format')})" for n, o in m["outputs"].items())
    title = TITLE_PREFIX + recipe_out
    head = (f'<p class="muted">shardsmith {esc(m.get("shardsmith_version"))}; '
            f'recipe fingerprint <code>{esc(str(m.get("recipe_fingerprint", ""))[:16])}</code>; split seed {esc((m.get("split") or {}).get("seed"))}</p>')
    warns = "".join(f'<p class="warn">warning: {esc(w)}</p>' for w in m.get("warnings") or [])
    extra = "".join(f'<p class="warn">{esc(n)}</p>' for n in notes + data.notes)
    body = "".join([f"<h1>{esc(title)}</h1>", head, warns, extra, _counts(m), _buckets(m), _sources(m),
                    _models(m, random), _teacher_preview(data.preview), _sheets(sheets, random),
                    _histograms(data, facts), _verify(data.verify)])
    return (PAGE_HEAD + esc(title[len(TITLE_PREFIX):]) + f"</title><style>{_CSS}</style></head>"
            f"<body>{body}</body></html>\n")

