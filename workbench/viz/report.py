"""Self-contained HTML pages of charts (no Jupyter, no network): `workbench report RUN` for one run, and
the page `Comparison.report` writes.

plotly.js is embedded once, in the first chart (about 4.5 MB; every later chart refers to it), and each
chart keeps the height its figure asks for instead of filling the window.
"""

from __future__ import annotations

import html
import os

import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.run import Run, load


def html_page(title: str, sections: list[tuple[str, go.Figure | pd.DataFrame | str]]) -> str:
    """One page: a heading per section, then its chart (plotly.js embedded in the first only), table or text."""
    parts, first = [], True
    for heading, body in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        if isinstance(body, go.Figure):
            height = body.layout.height or 450
            parts.append(
                body.to_html(
                    full_html=False,
                    include_plotlyjs=first,
                    default_height=f"{height}px",
                    default_width="100%",
                    config={"responsive": True},
                )
            )
            first = False
        elif isinstance(body, pd.DataFrame):
            parts.append(body.to_html(index=False, float_format="{:.4g}".format, border=0))
        else:
            parts.append(f"<p>{html.escape(body)}</p>")
    style = (
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
        "table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #ddd}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>{''.join(parts)}</body></html>"
    )


def run_sections(run: Run) -> list[tuple[str, go.Figure | pd.DataFrame | str]]:
    """What one run's report shows: its configuration, the per-rank summary, loss, timeline, memory."""
    from workbench import viz

    s = run.summary
    rows = [
        {
            k: r.get(k)
            for k in (
                "rank",
                "step_time_s",
                "compute_s",
                "comm_s",
                "overlap_s",
                "idle_s",
                "peak_total_bytes",
            )
        }
        for r in s.get("ranks", [])
    ]
    out: list[tuple[str, go.Figure | pd.DataFrame | str]] = [
        (
            "configuration",
            pd.DataFrame([{k: v for k, v in run.config.items() if not isinstance(v, dict | list)}]),
        ),
        ("per rank (measured)", pd.DataFrame(rows)),
    ]
    if len(run.metrics):
        out.append(("loss", viz.loss_curves({os.path.basename(run.path): run})))
    if not run.events.empty:
        out.append(("timeline (the last two steps)", viz.timeline(run)))
    if not run.memory.empty:
        out += [
            ("memory by category, measured beside predicted", viz.memory_breakdown(run)),
            ("memory over time, rank 0", viz.memory_over_time(run)),
        ]
    return out


def write_run_report(run_dir: str, path: str | None = None) -> str:
    """RUN/report.html (or `path`): the run's charts in one file that opens in any browser."""
    run = load(run_dir)
    path = path or os.path.join(run_dir, "report.html")
    with open(path, "w") as f:
        f.write(
            html_page(
                f"workbench run {os.path.basename(os.path.abspath(run_dir))}", run_sections(run)
            )
        )
    return path
