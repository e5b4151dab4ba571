"""Plots as inline SVG (no matplotlib, no script): a histogram of numbers and a bar chart of
counts by name. Every label is escaped; the SVG is a string to place in the page as is."""

from __future__ import annotations

from html import escape
from typing import Sequence

WIDTH, HEIGHT = 360, 170
_LEFT, _BOTTOM, _TOP = 40, 34, 22


def _fmt(x: float) -> str:
    if x == int(x) and abs(x) < 1e6:
        return str(int(x))
    return f"{x:.3g}"


def bins_of(values: Sequence[float], n_bins: int = 20) -> tuple[list[float], list[int]]:
    """Equal-width bins over ``values``: (edges, counts); one bin when all values are equal."""
    lo, hi = min(values), max(values)
    if hi == lo:
        return [lo, hi], [len(values)]
    n = max(1, min(n_bins, len(set(values))))
    step = (hi - lo) / n
    counts = [0] * n
    for v in values:
        counts[min(n - 1, int((v - lo) / step))] += 1
    return [lo + i * step for i in range(n + 1)], counts


def _frame(title: str, body: list[str], x_labels: list[tuple[float, str]], y_max: int) -> str:
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
             f'<text x="{WIDTH / 2}" y="14" text-anchor="middle" class="pt">{escape(title)}</text>',
             f'<line x1="{_LEFT}" y1="{HEIGHT - _BOTTOM}" x2="{WIDTH - 8}" y2="{HEIGHT - _BOTTOM}" class="ax"/>',
             f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{HEIGHT - _BOTTOM}" class="ax"/>',
             f'<text x="{_LEFT - 4}" y="{_TOP + 4}" text-anchor="end" class="tl">{y_max}</text>',
             f'<text x="{_LEFT - 4}" y="{HEIGHT - _BOTTOM}" text-anchor="end" class="tl">0</text>']
    parts += body
    for x, label in x_labels:
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - _BOTTOM + 13}" text-anchor="middle" class="tl">'
                     f'{escape(label)}</text>')
    parts.append('</svg>')
    return "".join(parts)


def histogram(title: str, values: Sequence[float], n_bins: int = 20) -> str:
    """An SVG histogram of ``values`` (an empty note when there are none)."""
    if not values:
        return ""
    edges, counts = bins_of(values, n_bins)
    y_max = max(counts)
    plot_w, plot_h = WIDTH - _LEFT - 8, HEIGHT - _BOTTOM - _TOP
    bw = plot_w / len(counts)
    body = []
    for i, c in enumerate(counts):
        h = plot_h * c / y_max if y_max else 0
        x = _LEFT + i * bw
        body.append(f'<rect x="{x + 0.5:.1f}" y="{HEIGHT - _BOTTOM - h:.1f}" width="{max(bw - 1, 0.5):.1f}" '
                    f'height="{h:.1f}" class="bar"><title>{escape(_fmt(edges[i]))}..{escape(_fmt(edges[i + 1]))}: '
                    f'{c}</title></rect>')
    labels = [(_LEFT, _fmt(edges[0])), (_LEFT + plot_w, _fmt(edges[-1]))]
    if len(counts) > 2:
        labels.append((_LEFT + plot_w / 2, _fmt((edges[0] + edges[-1]) / 2)))
    return _frame(f"{title} (n={len(values)})", body, labels, y_max)


def bars(title: str, counts: dict[str, int], max_bars: int = 24) -> str:
    """An SVG bar chart of ``counts`` by name, largest first (the rest summed as "other")."""
    if not counts:
        return ""
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(items) > max_bars:
        items = items[:max_bars - 1] + [("other", sum(v for _, v in items[max_bars - 1:]))]
    y_max = max(v for _, v in items) or 1
    plot_w, plot_h = WIDTH - _LEFT - 8, HEIGHT - _BOTTOM - _TOP
    bw = plot_w / len(items)
    body, labels = [], []
    for i, (name, c) in enumerate(items):
        h = plot_h * c / y_max
        x = _LEFT + i * bw
        body.append(f'<rect x="{x + 1:.1f}" y="{HEIGHT - _BOTTOM - h:.1f}" width="{max(bw - 2, 0.5):.1f}" '
                    f'height="{h:.1f}" class="bar"><title>{escape(name)}: {c}</title></rect>')
        if len(items) <= 6:
            labels.append((x + bw / 2, name if len(name) <= 14 else name[:13] + "…"))
    return _frame(f"{title} (n={sum(counts.values())})", body, labels, y_max)

