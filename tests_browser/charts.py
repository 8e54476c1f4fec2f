"""What the browser suite checks inside a notebook's charts, beyond "it rendered": legend colours that are
the marks' colours, the Young/Daly chart's axes, the explorers' controls agreeing with their charts."""

from __future__ import annotations

from tests_browser.conftest import SHOTS

#: every trace's drawn colour per legend entry (legendgroup, else name), per chart — and, for the span kinds
#: and memory categories of viz/palette.py, the colour they are drawn in
TRACE_COLOURS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(g => (g._fullData || [])
    .filter(t => t.visible !== false && t.visible !== 'legendonly')
    .map(t => { const m = t.marker && typeof t.marker.color === 'string' ? t.marker.color : null;
                const l = t.line && typeof t.line.color === 'string' ? t.line.color : null;
                const mode = t.mode || '';
                const c = t.type === 'scatter' && mode.indexOf('markers') < 0 ? l : (m || l);
                const y = (g._fullLayout.yaxis || {}).title || {};
                return {group: t.legendgroup || t.name || '', name: t.name || '', color: c,
                        title: JSON.stringify((g.layout.title || {}).text || g.layout.title || ''),
                        timeline: String(y.text || '').includes('rank · lane')}; }))"""


def _norm(color: str | None) -> str | None:
    """'#e45756', 'rgb(228, 87, 86)' → one form."""
    if not color:
        return None
    color = color.strip().lower()
    if color.startswith("#") and len(color) == 7:
        return f"rgb({int(color[1:3], 16)}, {int(color[3:5], 16)}, {int(color[5:7], 16)})"
    return (
        color.replace("rgba(", "rgb(").rsplit(",", 1)[0] + ")"
        if color.startswith("rgba(")
        else color
    )


def marks_use_their_legend_colours(page) -> None:
    """Every chart: the traces of one legend entry are drawn in one colour (the legend shows the colour of
    its first trace: a second panel's dots in another colour would not be what the legend says); across
    the notebook, a span kind or memory category of viz/palette.py is drawn in the palette's colour."""
    from workbench.viz.palette import MEMORY_COLORS, SPAN_COLORS

    palette = {name: _norm(c) for name, c in {**SPAN_COLORS, **MEMORY_COLORS}.items()}
    for chart in page.evaluate(TRACE_COLOURS):
        seen: dict[str, str] = {}
        for t in chart:
            c = _norm(t["color"])
            if c is None or not t["group"]:
                continue
            assert seen.setdefault(t["group"], c) == c, (
                t["title"],
                t["group"],
                seen[t["group"]],
                c,
            )
            if t["name"] in palette and t["timeline"]:
                assert c == palette[t["name"]], (t["title"], t["name"], c, palette[t["name"]])


def young_daly_axes_hold_the_curve(page, stem: str) -> None:
    """Notebook 08's Young/Daly chart: its log x-axis spans the curve (τ*/5 … ≈ 28 τ*), not up to 10^27 as
    when the τ* label was placed at x = τ* on a log axis; the time lost stays on a readable scale."""
    axes = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')]
        .filter(g => JSON.stringify(g.layout.title || '').includes('checkpoint interval'))
        .map(g => ({x: g._fullLayout.xaxis.range, y: g._fullLayout.yaxis.range}))""")
    assert axes, "a Young/Daly chart"
    for a in axes:
        assert -3 < a["x"][0] < a["x"][1] < 7, a
        assert a["x"][1] - a["x"][0] < 3, ("about 2.2 decades of interval", a)
        assert 0 <= a["y"][0] and a["y"][1] < 200, a


def ring_slider_keeps_its_title(page, stem: str) -> None:
    """Notebook 01's ring chart: its plotly slider moved to the last step, the title still says what each
    rank sent (a bare-string title in the slider's update used to remove it)."""
    index = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].findIndex(g =>
        g.layout && g.layout.sliders && g.layout.sliders.length && JSON.stringify(g.layout.title).includes('ring'))""")
    assert index >= 0, "a ring chart with a slider"
    chart = page.locator(".js-plotly-plot").nth(index)
    chart.scroll_into_view_if_needed()
    rail = chart.locator(".slider-rail-rect").first.bounding_box()
    page.mouse.click(rail["x"] + rail["width"] - 2, rail["y"] + rail["height"] / 2)
    page.wait_for_timeout(1500)
    chart.screenshot(path=str(SHOTS / f"{stem}-ring-last-step.png"))
    title = chart.locator(".gtitle").first.text_content()
    assert "busiest rank has sent" in title, title


def interleaved_controls_agree_with_the_chart(page, stem: str) -> None:
    """Notebook 03's bubble explorer: choosing interleaved, the m slider shows the m drawn (a multiple of p);
    choosing 1f1b, v is marked as unused and the chart draws v = 1."""
    box = page.locator(".jp-OutputArea-output:has(select):has(.js-plotly-plot)").first
    box.scroll_into_view_if_needed()
    readouts = box.locator(".widget-readout")

    def shown() -> tuple[str, list[str]]:
        page.wait_for_timeout(1500)
        return box.locator(".gtitle").first.text_content(), [
            readouts.nth(i).text_content() for i in range(5)
        ]

    box.locator("select").first.select_option("interleaved")
    title, (_, _, p, m, v) = shown()
    assert f"p={p}, m={m}, v={v}" in title and int(m) % int(p) == 0, (title, p, m, v)
    box.screenshot(path=str(SHOTS / f"{stem}-interleaved.png"))
    box.locator("select").first.select_option("1f1b")
    title, (_, _, p, m, v) = shown()
    assert f"p={p}, m={m}, v=1" in title, title
    assert "interleaved only" in box.text_content()


def log_axes_hold_their_data(page) -> None:
    """No log axis of any chart spans more than 9 decades: a label or line placed at x = value on a log axis
    (plotly reads an annotation's x there as log10) stretched one to 10^27 and crushed its data to an edge."""
    spans = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].flatMap(g =>
        Object.entries(g._fullLayout || {}).filter(([k, a]) => /^[xy]axis\\d*$/.test(k) && a && a.type === 'log')
        .map(([k, a]) => ({axis: k, range: a.range, title: JSON.stringify((g.layout.title || {}).text || '')})))""")
    for s in spans:
        assert s["range"][1] - s["range"][0] < 9, s


#: every table cell on the page — pandas' HTML tables and plotly's table traces — that shows a missing value
MISSING_CELLS = """(scope) => {
    const cells = [...document.querySelectorAll(scope + ' table td, ' + scope + ' table th, '
                                               + scope + ' .js-plotly-plot .table .cell-text')];
    return cells.filter(c => /^\\s*(nan|NaN|<NA>|NaT)\\s*$/.test(c.textContent)).map(c => {
        const row = c.closest('tr');
        const table = c.closest('table');
        const head = table ? [...table.querySelectorAll('thead th')].map(h => h.textContent.trim()).join(' | ') : '';
        const cells = row ? [...row.cells].map(x => x.textContent.trim()).join(' | ') : c.textContent;
        return cells + (head ? '  [' + head + ']' : '');
    }); }"""


def no_missing_values_in_tables(page, scope: str = ".jp-OutputArea-output") -> None:
    """No table cell shows NaN (or <NA>, NaT): where no formula or no measurement applies, a table says so
    with a dash, not with pandas' missing value."""
    missing = page.evaluate(MISSING_CELLS, scope)
    assert not missing, f"table cells showing a missing value (rows): {missing}"


#: every visible ipywidgets label whose text is wider than its box (cut, or ended with an ellipsis)
CUT_LABELS = """() => [...document.querySelectorAll(
        '.widget-label, .widget-label-basic, .widget-inline-hbox label, .widget-toggle-button, .widget-button')]
    .filter(e => e.offsetParent !== null && e.textContent.trim() && getComputedStyle(e).display !== 'inline')
    .filter(e => e.scrollWidth > e.clientWidth + 1)
    .map(e => e.textContent.trim() + ' (' + e.scrollWidth + ' px of text in ' + e.clientWidth + ' px)')"""


def widget_labels_fit(page) -> None:
    """Every control's label shows its whole text: its box is as wide as the text it holds."""
    cut = page.evaluate(CUT_LABELS)
    assert not cut, f"widget labels cut: {cut}"


def yours_beside_the_reference(page, stem: str) -> None:
    """Notebook 13's checks: each exercise that ran on ranks draws the learner's timeline beside the
    reference's — two panels, both with bars (read from plotly's full data: plotly.py sends arrays packed, which
    `data` keeps as they came). The first is kept as a screenshot
    (traces/browser/13_exercises-side-by-side.png)."""
    found = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')]
        .map((g, i) => ({i, title: JSON.stringify(g.layout.title || ''),
                         panels: (g.layout.annotations || []).map(a => a.text),
                         bars: (g._fullData || []).filter(t => t.type === 'bar' && t.x && t.x.length)
                                     .map(t => t.xaxis || 'x')}))
        .filter(g => g.title.includes("your timeline beside the reference"))""")
    assert found, "a learner's timeline beside the reference's"
    for chart in found:
        assert {"your solution", "the reference"} <= set(chart["panels"]), chart
        assert {"x", "x2"} <= set(chart["bars"]), ("bars in both panels", chart)
    shot = page.locator(".js-plotly-plot").nth(found[0]["i"])
    shot.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    shot.screenshot(path=str(SHOTS / f"{stem}-side-by-side.png"))
