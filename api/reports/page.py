"""The page around a report: one self-contained HTML document, plotly.js inline, every trace string escaped.

Strings that come from traces (kernel, job and label names, process groups) reach
a page only through :func:`esc` (HTML text and attributes) or :func:`plot_text`
(text plotly.js draws, which it reads as a small subset of HTML); markup built
here is an :class:`Html` value, so nothing is escaped twice or forgotten.
"""

from __future__ import annotations

import datetime as dt
import functools
import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from tracelake.warehouse.core import tracelake_version

#: What the page may load: nothing from anywhere (the data: images are plotly's own heat maps).
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:; connect-src 'none'; base-uri 'none'; form-action 'none'"
)
#: plotly's modebar without the cloud and logo buttons (which would link out).
PLOT_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["sendDataToCloud"]}
COLOURS = {
    "compute": "#4c78a8", "overlapped": "#72b7b2", "exposed": "#e45756", "communication": "#e45756",
    "memory": "#b279a2", "other": "#9d755d", "idle": "#bab0ac", "host_wait": "#f58518", "kernel_wait": "#eeca3b",
    "wasted": "#e45756",
}

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2733;background:#f6f7f9}
main{max-width:1200px;margin:0 auto;padding:24px}
h1{font-size:1.6em;margin:0 0 4px}h2{font-size:1.2em;margin:0 0 8px}
.meta{color:#5b6673;font-size:.9em;margin:0 0 16px}
section{background:#fff;border:1px solid #e1e4e8;border-radius:6px;padding:16px;margin:0 0 16px}
.note{color:#5b6673;font-size:.9em;margin:6px 0}
table{border-collapse:collapse;width:100%;font-size:.88em;margin:8px 0}
th,td{padding:4px 8px;border-bottom:1px solid #eceef1;text-align:left;vertical-align:top}
th{background:#f3f4f6;font-weight:600}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.name{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.92em;word-break:break-all}
ol.findings{padding-left:20px}ol.findings li{margin:0 0 10px}.gain{color:#b42318;font-weight:600}
.cards{display:flex;flex-wrap:wrap;gap:12px}.card{flex:1 1 160px;background:#f3f6fa;border-radius:6px;padding:10px}
.card .value{font-size:1.5em;font-weight:600}.card .label{color:#5b6673;font-size:.85em}
.up{color:#b42318}.down{color:#067647}
"""


class Html(str):
    """Markup that is safe to put in a page as it is (built here, every outside string escaped)."""


def esc(value: object) -> Html:
    """``value`` as HTML text or attribute content; :class:`Html` passes unchanged, None is empty."""
    if isinstance(value, Html):
        return value
    return Html("" if value is None else html.escape(str(value), quote=True))


def concat(parts: Iterable[object]) -> Html:
    """Parts one after the other, each escaped unless it is already :class:`Html`."""
    return Html("".join(esc(p) for p in parts))


def tag(name: str, *children: object, **attrs: object) -> Html:
    """``<name attrs>children</name>``; ``class_`` gives ``class``; attributes whose value is None are left out."""
    rendered = "".join(f' {key.rstrip("_").replace("_", "-")}="{esc(value)}"'
                       for key, value in attrs.items() if value is not None)
    return Html(f"<{name}{rendered}>{concat(children)}</{name}>")


def link(text: object, href: str | None) -> Html:
    """``text`` as a link to ``href``, or plain text when there is none."""
    return tag("a", text, href=href) if href else esc(text)


def plot_text(value: object) -> str:
    """A string for plotly.js to draw: it reads ``<...>`` as markup, so angle brackets and ``&`` are escaped.

    plotly.js turns ``&lt;``, ``&gt;`` and ``&amp;`` back into the characters when drawing.
    """
    return html.escape("" if value is None else str(value), quote=False)


@dataclass(frozen=True)
class Column:
    """A table column: its heading and whether it holds numbers (right-aligned) or names (monospace)."""

    heading: str
    kind: str = "text"  # "text", "num" or "name"


def table(columns: Sequence[Column], rows: Iterable[Sequence[object]]) -> Html:
    """An HTML table; cells are escaped unless they are :class:`Html`."""
    head = concat(tag("th", c.heading, class_="num" if c.kind == "num" else None) for c in columns)
    body = concat(
        tag("tr", *(tag("td", cell, class_=c.kind if c.kind != "text" else None) for c, cell in zip(columns, row)))
        for row in rows
    )
    return tag("table", tag("thead", tag("tr", head)), tag("tbody", body))


def figure(fig: go.Figure, name: str, height: int = 380) -> Html:
    """A plotly figure as a div (id ``plot-<name>``) and the script that draws it (plotly.js is in the page head)."""
    fig.update_layout(template="plotly_white", height=height, margin={"l": 60, "r": 20, "t": 40, "b": 50},
                      font={"family": "system-ui, sans-serif", "size": 12})
    return Html(pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f"plot-{name}", config=PLOT_CONFIG))


def section(title: str, *children: object, id_: str | None = None) -> Html:
    """A titled block of the page."""
    return tag("section", tag("h2", title), *children, id=id_)


def note(text: object) -> Html:
    """A short grey remark (what a chart shows, why a part is empty)."""
    return tag("p", text, class_="note")


@functools.cache
def _plotly_js() -> str:
    return get_plotlyjs()


def page(title: str, meta: object, body: Iterable[object]) -> str:
    """The whole document: CSP, styles and plotly.js inline, ``title`` as heading, then ``body``."""
    version = tracelake_version()
    head = (
        '<meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(CONTENT_SECURITY_POLICY)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="tracelake {esc(version)}">'
        '<link rel="icon" href="data:,">'
        f"<title>{esc(title)}</title><style>{_STYLE}</style>"
        '<script>window.PlotlyConfig = {MathJaxConfig: "local"};</script>'
        f'<script charset="utf-8">{_plotly_js()}</script>'
    )
    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    footer = note(f"Generated by tracelake {version} at {generated}. Definitions: docs/analyses.md.")
    return (
        f"<!DOCTYPE html>\n<html lang=\"en\"><head>{head}</head><body><main>"
        f"{tag('h1', title)}{tag('p', meta, class_='meta')}{concat(body)}{footer}</main></body></html>\n"
    )


@dataclass(frozen=True)
class HoursUnit:
    """The unit device time is shown in on a page: hours for a fleet, seconds for a few short traces."""

    name: str
    per_hour: float

    @classmethod
    def for_hours(cls, largest: float | None) -> HoursUnit:
        """The largest unit in which ``largest`` device-hours is at least 1."""
        value = largest or 0.0
        if value >= 1:
            return cls("device-hours", 1.0)
        if value * 60 >= 1:
            return cls("device-minutes", 60.0)
        return cls("device-seconds", 3600.0)

    def convert(self, hours: float | None) -> float | None:
        """``hours`` in this unit."""
        return None if hours is None else hours * self.per_hour

    def format(self, hours: float | None) -> str:
        """``hours`` in this unit, for a table cell."""
        value = self.convert(hours)
        return "" if value is None else f"{value:,.{2 if value < 100 else 0}f}"


def ms(ns: float | None, digits: int = 1) -> str:
    """Nanoseconds as milliseconds for people (``12.3 ms``); empty for unknown."""
    return "" if ns is None else f"{ns / 1e6:,.{digits}f} ms"


def pct(value: float | None, digits: int = 1) -> str:
    """A percentage (``12.3%``); empty for unknown."""
    return "" if value is None else f"{value:,.{digits}f}%"


def number(value: float | None, digits: int = 1) -> str:
    """A number with thousands separators; empty for unknown."""
    return "" if value is None else f"{value:,.{digits}f}"


def signed(value: float | None, unit: str = "%", digits: int = 1) -> Html:
    """A change (``+3.2%``), marked up (red) or down (green); ``-`` when unknown."""
    if value is None:
        return esc("-")
    return tag("span", f"{value:+,.{digits}f}{unit}", class_="up" if value > 0 else "down" if value < 0 else None)
