"""The HTML report (issue 16, "Something to look at"): ``shardsmith report OUT`` and the report
``build`` writes at the end.

What the page must hold is checked on its text (counts, reasons, example ids, escaped user
strings, one decodable ``data:`` image per thumbnail, the random-weights label), then the page
is opened in headless Chromium (Debian's ``chromium``): the dumped DOM shows the counts and the
browser logged no console message. Chromium writes every console message of the page (errors,
uncaught exceptions, Content-Security-Policy violations, which is what any fetch or script in
the report would cause) to stderr as an ``INFO:CONSOLE`` line when started with
``--enable-logging=stderr --v=0``; the page has no script, so any such line is a failure
(:func:`console_lines`, itself tested on a page that logs on purpose).
"""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from media_factory import real_photos
from shardsmith.build import build
from shardsmith.formats.build_dir import REPORT_FILE, VERIFY_DIR
from shardsmith.recipe import load_recipe, recipe_from_dict
from shardsmith.report_html import ReportError, write_report
from shardsmith.report_html.gather import item_stats
from shardsmith.report_html.page import RANDOM_LABEL, counts_line

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                    "(apt-get install -y chromium; .ci/run installs it)")
EVIL = '<script>alert("pwned")</script> & <b>bold</b>'
DATA_URI = re.compile(r'<img src="data:image/(jpeg|png);base64,([A-Za-z0-9+/=]+)"')


def run_cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True,
                          timeout=600, **kw)


def chromium_dom(page: Path, tmp: Path) -> tuple[str, list[str]]:
    """(the DOM Chromium renders from ``page``, the console lines it logged)."""
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                        f"--user-data-dir={tmp / 'chromium-profile'}", "--virtual-time-budget=5000", "--dump-dom",
                        page.resolve().as_uri()], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, console_lines(r.stderr)


def console_lines(stderr: str) -> list[str]:
    """The page's console messages in Chromium's stderr log (``...:INFO:CONSOLE(12)] "msg", source: ...``
    or ``:INFO:CONSOLE:12]``); Chromium's own log lines (dbus, GPU ...) are not the page's."""
    return [line for line in stderr.splitlines() if re.search(r":CONSOLE[(:]\d+", line)]


def dom_text(dom: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"<style>.*?</style>", "", dom, flags=re.S)))


def decode_thumbs(html: str) -> list[Image.Image]:
    out = []
    for _fmt, b64 in DATA_URI.findall(html):
        im = Image.open(io.BytesIO(base64.b64decode(b64)))
        im.load()
        out.append(im)
    return out


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """The README's quickstart, built by the Python API with its report."""
    from conftest import EXAMPLE

    out = tmp_path_factory.mktemp("report") / "qs"
    build(load_recipe(EXAMPLE / "recipe.yaml"), out, quiet=True, workers=2, report=True)
    return out


@pytest.fixture(scope="module")
def nasty(tmp_path_factory):
    """A small folder with a caption and a file name that hold markup, a broken image and a
    duplicate: reasons and examples to show, strings to escape."""
    src = tmp_path_factory.mktemp("nasty_src")
    photos = real_photos(src, 6, seed=3, min_side=60, max_side=120)
    for i, p in enumerate(photos):
        p.with_suffix(".txt").write_text(f"photo {i}", encoding="utf-8")
    photos[0].with_suffix(".txt").write_text(EVIL, encoding="utf-8")
    weird = src / "we<i>rd.jpg"
    shutil.copy(photos[1], src / "copy_of_1.jpg")  # a duplicate
    weird.write_bytes(photos[2].read_bytes()[:-1] + b"\x00")  # decodes; different bytes
    (src / "broken.jpg").write_bytes(b"not a jpeg at all")
    out = tmp_path_factory.mktemp("nasty") / "out"
    recipe = recipe_from_dict({"sources": [{"path": str(src), "name": "evil"}], "split": {"holdout": 2, "seed": 1},
                               "outputs": [{"format": "wds", "dir": "wds", "samples_per_shard": 3}]})
    m = build(recipe, out, quiet=True, workers=1, report=True)
    return out, m


def test_quickstart_report_holds_the_counts_and_decodable_thumbnails(quickstart):
    page = quickstart / REPORT_FILE
    assert page.is_file()  # written by build(report=True)
    html = page.read_text(encoding="utf-8")
    m = json.loads((quickstart / "manifest.json").read_text())
    text = dom_text(html)
    assert counts_line("all outputs (per item)", m["counts"]) in text
    for name, o in m["outputs"].items():
        assert counts_line(f"output {name}", o["counts"]) in text
    thumbs = decode_thumbs(html)
    assert len(thumbs) == html.count("<img") >= 8  # every <img> is a decodable data: URI
    assert all(max(im.size) <= 128 for im in thumbs)
    for head in ("wds / train: thumbnails", "wds / holdout: thumbnails", "zip / train: thumbnails"):
        assert head in text
    assert "image width (px)" in html and "<svg" in html  # the histograms, inline
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing to fetch
    assert "https://" not in html and "<script" not in html


def test_reasons_examples_and_escaped_user_strings(nasty):
    out, m = nasty
    html = (out / REPORT_FILE).read_text(encoding="utf-8")
    wds = m["outputs"]["wds"]
    reasons = {f"{k}:{r}" for blk in wds["splits"].values() for k in ("skipped", "failed") for r in blk[k]}
    assert {"failed:not_an_image", "skipped:duplicate"} <= reasons
    for split, blk in wds["splits"].items():
        for status, ex in blk["examples"].items():
            assert status in html
            for i in ex["ids"]:
                assert f"<code>{_esc(i)}</code>" in html
            assert _esc(ex["detail"]) in html
    assert counts_line("output wds", wds["counts"]) in dom_text(html)
    # the caption and the file name with markup are shown, escaped, never as markup
    assert "<script>alert" not in html and "<i>rd" not in html and "<b>bold" not in html
    assert _esc(EVIL) in html
    assert "we&lt;i&gt;rd.jpg" in html


def _esc(s: str) -> str:
    import html

    return html.escape(s, quote=True)


def test_item_stats_sample_the_ledger_in_sql(quickstart):
    st = item_stats(quickstart / ".shardsmith" / "ledger.sqlite", max_sampled=10)
    assert st.total == 206 and st.sampled == 10 and len(st.widths) == 10
    assert st.kinds == {"image": 206}


def test_report_cli_and_its_mistakes(quickstart, tmp_path):
    r = run_cli("report", quickstart, "--output", tmp_path / "r.html")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "r.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    for bad, says in ((tmp_path / "nope", "does not exist"), (tmp_path, "not a shardsmith build")):
        r = run_cli("report", bad)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(ReportError, match="is a folder"):
        write_report(quickstart, tmp_path)
    (tmp_path / "half" / ".shardsmith").mkdir(parents=True)
    (tmp_path / "half" / ".shardsmith" / "ledger.sqlite").write_bytes(b"")
    with pytest.raises(ReportError, match="build not finished"):
        write_report(tmp_path / "half")


@pytest.mark.slow
def test_build_no_report_and_a_failing_report_keeps_the_build(example_recipe, tmp_path, monkeypatch, capsys):
    r = run_cli("build", example_recipe, "--out", tmp_path / "a", "--quiet", "--no-report")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "a" / "manifest.json").is_file() and not (tmp_path / "a" / REPORT_FILE).exists()

    import shardsmith.report_html as report_html

    def broken(*a, **k):
        raise RuntimeError("no report today")

    monkeypatch.setattr(report_html, "write_report", broken)
    m = build(load_recipe(example_recipe), tmp_path / "b", quiet=True, workers=1, report=True)
    assert m["counts"]["written"] == 206 and (tmp_path / "b" / "manifest.json").is_file()
    err = capsys.readouterr().err
    assert "warning: the build is complete, but its HTML report could not be written" in err
    assert "no report today" in err


def test_report_file_belongs_to_the_build(quickstart):
    from shardsmith.safety.outdir import foreign_files

    assert REPORT_FILE not in foreign_files(quickstart)  # --overwrite replaces it, never "keeps" it as the user's


# -- Chromium ----------------------------------------------------------------------------------

@needs_chromium
def test_console_checker_catches_a_console_error(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><p>count 42</p><script>console.error('deliberate x')</script>"
                   "</body></html>", encoding="utf-8")
    dom, console = chromium_dom(bad, tmp_path)
    assert "count 42" in dom
    assert len(console) == 1 and "deliberate x" in console[0]
    clean = tmp_path / "clean.html"
    clean.write_text("<!DOCTYPE html><html><body><p>count 42</p></body></html>", encoding="utf-8")
    assert chromium_dom(clean, tmp_path)[1] == []


@needs_chromium
def test_quickstart_report_renders_in_chromium_without_console_errors(quickstart, nasty, tmp_path):
    m = json.loads((quickstart / "manifest.json").read_text())
    dom, console = chromium_dom(quickstart / REPORT_FILE, tmp_path)
    assert console == []
    text = dom_text(dom)
    assert counts_line("all outputs (per item)", m["counts"]) in text
    for name, o in m["outputs"].items():
        assert counts_line(f"output {name}", o["counts"]) in text
    dom, console = chromium_dom(nasty[0] / REPORT_FILE, tmp_path)
    assert console == [] and "failed:not_an_image" in dom
    # the caption is text in the rendered page (serialised escaped), no element: its <script> never ran
    assert EVIL.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in dom
    assert "<script" not in dom and "<b>bold" not in dom


@needs_chromium
def test_every_thumbnail_loads_in_chromium(quickstart, tmp_path):
    """A copy of the page with a probe script (the CSP that forbids scripts removed) counts the
    images the browser could not decode; one broken image is added to prove the probe works."""
    html = (quickstart / REPORT_FILE).read_text(encoding="utf-8")
    html = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html)
    n = html.count("<img")
    html = html.replace('<figure class="thumb">', '<figure class="thumb"><img src="data:image/png;base64,AAAA" '
                        'alt="deliberately-broken">', 1)
    probe = ("<script>window.addEventListener('load', () => { const bad = [...document.images].filter("
             "i => !i.complete || i.naturalWidth === 0); document.body.setAttribute('data-images', "
             "document.images.length); document.body.setAttribute('data-broken', bad.length); "
             "bad.forEach(i => console.error('broken image ' + i.alt)); });</script></body>")
    page = tmp_path / "probe.html"
    page.write_text(html.replace("</body>", probe), encoding="utf-8")
    dom, console = chromium_dom(page, tmp_path)
    assert f'data-images="{n + 1}"' in dom and 'data-broken="1"' in dom, re.search(r"<body[^>]*>", dom)
    assert len(console) == 1 and "deliberately-broken" in console[0]


# -- latents -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_latent_report_previews_per_bucket_labelled_random_and_the_last_verify(tmp_path):
    src = tmp_path / "src"
    real_photos(src, 8, seed=8, min_side=60, max_side=140)
    for i, p in enumerate(sorted(src.glob("*.jpg"))):
        p.with_suffix(".txt").write_text(f"photo {i} {EVIL}", encoding="utf-8")
    recipe = recipe_from_dict({
        "sources": [{"path": str(src)}], "split": {"holdout": 3, "seed": 1},
        "geometry": {"buckets": ["64x64x1", "64x48x1"]}, "images": {"upscale": True},
        "models": {"vae": {"family": "sd"}, "text": {"family": "minilm"}, "batch_size": 3},
        "outputs": [{"format": "precomputed", "unit": 4, "latent_dtype": "float32"},
                    {"format": "latent_wds", "dir": "lat", "samples_per_shard": 5}]})
    out = tmp_path / "lat"
    m = build(recipe, out, quiet=True, workers=2, report=True)
    html = (out / REPORT_FILE).read_text(encoding="utf-8")
    assert RANDOM_LABEL in html and "decode failed" not in html and "could not be loaded" not in html
    text = dom_text(html)
    for name in ("precomputed", "latent_wds"):
        for split, files in m["outputs"][name]["files"].items():
            for bucket in files["buckets"]:
                assert f"{name} / {split} / bucket {bucket}: decoded latent previews" in text
    previews = decode_thumbs(html)
    assert len(previews) == html.count("<img") == 16  # every written sample here (8 per output)
    assert _esc(EVIL) in html and "<script>alert" not in html

    # a verify of one of its datasets is kept in the build, and the next report shows it
    from shardsmith.verify.runner import verify

    rep = verify(out / "lat" / "64x48x1", world=1, workers=1, batch_size=1)
    rep = verify(out / "holdout" / "lat", world=1, workers=1, batch_size=1)
    # a bucket's folder verified on its own is kept under its own name; the multi-bucket output's verify keeps
    # one report, not one per bucket besides it
    kept = sorted((out / VERIFY_DIR).glob("*.json"))
    assert [p.name for p in kept] == ["holdout__lat.json", "lat__64x48x1.json"]
    assert json.loads(kept[0].read_text())["report"]["ok"] == rep["ok"]
    write_report(out, previews=False)
    html = (out / REPORT_FILE).read_text(encoding="utf-8")
    assert "holdout/lat (output latent_wds, split holdout)" in html
    assert "latent previews not drawn" in html
    if CHROMIUM:
        dom, console = chromium_dom(out / REPORT_FILE, tmp_path)
        assert console == [] and counts_line("all outputs (per item)", m["counts"]) in dom_text(dom)


def test_report_error_is_a_user_error(tmp_path):
    from shardsmith.errors import UserError

    with pytest.raises(ReportError) as e:
        write_report(tmp_path)
    assert isinstance(e.value, UserError) and "not a shardsmith build" in str(e.value)
