"""The run report: one self-contained HTML page (figures and videos embedded), for people to look at.

The page carries a small script that marks `<body data-media-ok="N/M">` once every image has decoded, so a
headless browser can check that nothing failed to load.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path

from worldloop.common.checkpoint import atomic_write_text

MIME = {".png": "image/png", ".gif": "image/gif", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}


@dataclass
class StageRecord:
    name: str
    status: str  # ran | skipped | failed | not available
    seconds: float
    produced: str = ""
    metrics: dict[str, float | str] = field(default_factory=dict)


@dataclass
class Media:
    title: str
    path: Path
    caption: str = ""


def _data_uri(path: Path) -> str:
    mime = MIME.get(path.suffix.lower())
    if mime is None:
        raise ValueError(f"report media {path}: unsupported type {path.suffix!r}; expected {sorted(MIME)}")
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return html.escape(str(v))


def _stage_table(stages: list[StageRecord]) -> str:
    rows = []
    for s in stages:
        metrics = "<br>".join(f"{html.escape(k)}: {_fmt(v)}" for k, v in s.metrics.items())
        rows.append(
            f"<tr class='{html.escape(s.status.replace(' ', '-'))}'><td>{html.escape(s.name)}</td>"
            f"<td>{html.escape(s.status)}</td><td>{s.seconds:.0f}</td><td>{html.escape(s.produced)}</td>"
            f"<td>{metrics}</td></tr>"
        )
    return (
        "<table><tr><th>stage</th><th>status</th><th>seconds</th><th>produced</th><th>key metrics</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _disagreements(stages: list[StageRecord]) -> str:
    """A warning box for every stage whose metrics carry a `disagreement` (a policy whose imagined and
    simulated success 95% intervals do not overlap; `rl_finetune.imagination.ranking.disagreement`)."""
    flagged = [(s.name, s.metrics["disagreement"]) for s in stages if s.metrics.get("disagreement")]
    if not flagged:
        return ""
    items = "".join(f"<li><b>{html.escape(n)}</b>: {html.escape(str(v))}</li>" for n, v in flagged)
    return f"<div class='warning'><b>Imagination and the simulator disagree</b><ul>{items}</ul></div>"


def _media_grid(items: list[Media]) -> str:
    cells = []
    for m in items:
        if not m.path.is_file():
            continue
        cells.append(
            f"<figure><img src='{_data_uri(m.path)}' alt='{html.escape(m.title)}'>"
            f"<figcaption><b>{html.escape(m.title)}</b> {html.escape(m.caption)}</figcaption></figure>"
        )
    return "<div class='grid'>" + "".join(cells) + "</div>" if cells else "<p>(none produced)</p>"


STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top}
.warning{background:#fff3cd;border:1px solid #e0b000;padding:0.5em 1em;margin:1em 0}
tr.failed{background:#fdd}tr.skipped{color:#666}tr.not-available{color:#999}
.grid{display:flex;flex-wrap:wrap;gap:1em}figure{margin:0}img{image-rendering:pixelated;min-width:256px;max-width:560px}
"""

CHECK_SCRIPT = """
window.addEventListener('load', () => {
  const imgs = Array.from(document.images);
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.setAttribute('data-media-ok', ok + '/' + imgs.length);
});
"""


def write_report(
    path: str | Path,
    title: str,
    stages: list[StageRecord],
    figures: list[Media],
    videos: list[Media],
    summary: dict | None = None,
) -> Path:
    """Write the report page to `path` (atomically) and return it."""
    path = Path(path)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{STYLE}</style><script>{CHECK_SCRIPT}</script></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        _disagreements(stages),
        "<h2>Stages</h2>",
        _stage_table(stages),
        "<h2>Videos (real | imagined)</h2>",
        _media_grid(videos),
        "<h2>Figures</h2>",
        _media_grid(figures),
    ]
    if summary:
        parts += ["<h2>Summary</h2><pre>", html.escape(json.dumps(summary, indent=2)), "</pre>"]
    parts.append("</body></html>")
    atomic_write_text(path, "\n".join(parts))
    return path
