"""A small SVG line chart with no plotting library (the GPU machine has none): panels of
latency against throughput, one line per engine, each point labelled (a request rate).
Axes are logarithmic: engines an order of magnitude apart share one chart."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
PANEL_W, PANEL_H = 420, 320
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 70, 20, 40, 50


@dataclass
class Series:
    name: str
    points: list[tuple[float, float, str]]  # (x, y, label), joined in this order


@dataclass
class Panel:
    title: str
    x_label: str
    y_label: str
    series: list[Series]


def _log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks between lo and hi (more in a narrow range, fewer in a wide one)."""
    span = math.log10(hi / lo)
    steps = (1, 1.5, 2, 3, 4, 5, 6, 8) if span < 1 else (1, 2, 5) if span < 3 else (1,)
    ticks = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        ticks += [m * 10.0 ** e for m in steps if lo <= m * 10.0 ** e <= hi]
    return ticks


def _fmt(v: float) -> str:
    if v >= 1000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


def _range(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    # Pad to the decade's 1-2-5 grid around the data, at least a factor 2 of span.
    lo, hi = lo / 1.3, hi * 1.3
    if hi / lo < 4:
        mid = math.sqrt(lo * hi)
        lo, hi = mid / 2, mid * 2
    return lo, hi


def _panel(p: Panel, ox: float, oy: float) -> list[str]:
    pts = [(x, y) for s in p.series for x, y, _ in s.points if x > 0 and y > 0]
    out = [f'<text x="{ox + PANEL_W / 2}" y="{oy + 22}" text-anchor="middle" '
           f'font-size="14" font-weight="bold">{escape(p.title)}</text>']
    x0, y0 = ox + MARGIN_L, oy + MARGIN_T
    w, h = PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B
    out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" '
               f'stroke="#444"/>')
    if not pts:
        return out + [f'<text x="{x0 + w / 2}" y="{y0 + h / 2}" text-anchor="middle">'
                      f'no data</text>']
    xlo, xhi = _range([x for x, _ in pts])
    ylo, yhi = _range([y for _, y in pts])

    def sx(x: float) -> float:
        return x0 + w * math.log(x / xlo) / math.log(xhi / xlo)

    def sy(y: float) -> float:
        return y0 + h - h * math.log(y / ylo) / math.log(yhi / ylo)

    for t in _log_ticks(xlo, xhi):
        out.append(f'<line x1="{sx(t):.1f}" y1="{y0}" x2="{sx(t):.1f}" y2="{y0 + h}" '
                   f'stroke="#ddd"/><text x="{sx(t):.1f}" y="{y0 + h + 16}" '
                   f'text-anchor="middle" font-size="11">{_fmt(t)}</text>')
    for t in _log_ticks(ylo, yhi):
        out.append(f'<line x1="{x0}" y1="{sy(t):.1f}" x2="{x0 + w}" y2="{sy(t):.1f}" '
                   f'stroke="#ddd"/><text x="{x0 - 6}" y="{sy(t) + 4:.1f}" '
                   f'text-anchor="end" font-size="11">{_fmt(t)}</text>')
    out.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 38}" text-anchor="middle" '
               f'font-size="12">{escape(p.x_label)}</text>')
    out.append(f'<text transform="translate({ox + 16},{y0 + h / 2}) rotate(-90)" '
               f'text-anchor="middle" font-size="12">{escape(p.y_label)}</text>')
    for i, s in enumerate(p.series):
        color = COLORS[i % len(COLORS)]
        # In the given order (rising request rate): past saturation throughput can fall back.
        good = [(x, y, lab) for x, y, lab in s.points if x > 0 and y > 0]
        if len(good) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, _ in good)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" '
                       f'stroke-width="2"/>')
        for x, y, lab in good:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{color}"/>'
                       f'<text x="{sx(x) + 6:.1f}" y="{sy(y) - 6:.1f}" font-size="10" '
                       f'fill="{color}">{escape(lab)}</text>')
    return out


def render(panels: list[Panel], title: str, note: str = "") -> str:
    """The SVG document: the panels side by side, a legend of the first panel's series."""
    width = PANEL_W * len(panels)
    names = [s.name for s in panels[0].series] if panels else []
    height = 40 + PANEL_H + 24 * len(names) + (20 if note else 0) + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="24" text-anchor="middle" font-size="15">'
           f'{escape(title)}</text>']
    for i, p in enumerate(panels):
        out += _panel(p, i * PANEL_W, 40)
    y = 40 + PANEL_H + 8
    for i, name in enumerate(names):
        color = COLORS[i % len(COLORS)]
        out.append(f'<line x1="{MARGIN_L}" y1="{y + 12}" x2="{MARGIN_L + 24}" y2="{y + 12}" '
                   f'stroke="{color}" stroke-width="3"/><text x="{MARGIN_L + 32}" '
                   f'y="{y + 16}" font-size="12">{escape(name)}</text>')
        y += 24
    if note:
        out.append(f'<text x="{MARGIN_L}" y="{y + 14}" font-size="11" fill="#555">'
                   f'{escape(note)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
