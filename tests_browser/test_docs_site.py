"""The documentation site as a reader opens it: `make docs` built traces/site/ (the Makefile builds it before
this suite), opened from the disk in a real chromium — the home page and its navigation, one notebook's page
with its plotly charts drawn by the site's own plotly.js, every page without a console error — and the chart
checks of the notebooks' suite shown to fail on a page made to fail them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests_browser.charts import CUT_LABELS, MISSING_CELLS, no_missing_values_in_tables
from tests_browser.conftest import CHROMIUM, SHOTS

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "traces" / "site"
#: a plotly chart that plotly.js has drawn with data (JavaScript, for a filter over chart elements)
HAS_DATA = "g => (g._fullData || []).length > 0"

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"no chromium at {CHROMIUM} (make test-browser)"
)


def _open(browser, path: Path):
    """A page opened from the disk (file://, as the README says to open the site), and its console errors."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on(
        "console",
        lambda m: errors.append(f"{m.text} @ {m.location}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, errors


def test_the_site_was_built():
    assert (SITE / "index.html").exists(), (
        "no traces/site/index.html: build the site first (make docs)"
    )


def test_the_home_page_opens_with_its_navigation(browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page, errors = _open(browser, SITE / "index.html")
    assert "workbench" in page.title()
    assert page.locator("h1", has_text="workbench").count() == 1
    nav = page.locator("nav.md-nav--primary .md-nav__link").all_text_contents()
    nav = " ".join(t.strip() for t in nav)
    for section in ("Getting started", "Lessons", "The `workbench` command", "formulas"):
        assert section.lower().replace("`", "") in nav.lower().replace("`", ""), (section, nav)
    assert page.locator("img[src$='timeline.png']").evaluate("i => i.naturalWidth") > 0, (
        "the picture loads"
    )
    page.screenshot(path=str(SHOTS / "site-index.png"))
    assert not errors, errors
    page.close()


def test_a_notebook_page_draws_its_charts(browser):
    page, errors = _open(browser, SITE / "lessons" / "03_pipeline_parallel.html")
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
    charts = page.locator(".js-plotly-plot")
    assert charts.count() >= 5, "the notebook's charts, drawn by plotly.js"
    drawn = page.evaluate(
        f"() => [...document.querySelectorAll('.js-plotly-plot')].filter({HAS_DATA}).length"
    )
    assert drawn == charts.count(), f"{drawn} of {charts.count()} charts have data"
    assert page.locator("pre, .jp-RenderedText").count() > 0, "its printed outputs"
    no_missing_values_in_tables(page, scope="article")
    page.screenshot(path=str(SHOTS / "site-notebook.png"))
    assert not errors, errors
    page.close()


def test_each_explorer_shows_the_chart_it_drew(browser):
    """An explorer's controls do not move on the site, but what its Output widget drew when the notebook ran is
    there under its note, drawn (notebook 01: the bucket-size control's chart, the timeline's step slider)."""
    page, errors = _open(browser, SITE / "lessons" / "01_data_parallel.html")
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
    charts_per_note = page.evaluate(
        "() => [...document.querySelectorAll('.wb-widget')].map(n => [...n.closest('.jp-OutputArea-output')"
        f".querySelectorAll('.js-plotly-plot')].filter({HAS_DATA}).length)"
    )
    assert charts_per_note == [1, 1], charts_per_note
    assert not errors, errors
    page.close()


def test_every_page_opens_without_a_console_error(browser):
    """Every page opens without a console error, and no table of a notebook's page shows NaN — every page but
    404.html, which a server shows for a missing path (its links are absolute: from the disk they lead nowhere,
    and no page links to it)."""
    pages = sorted(p for p in SITE.rglob("*.html") if p.name != "404.html")
    assert len(pages) > 20, pages
    failed = {}
    for path in pages:
        page, errors = _open(browser, path)
        page.wait_for_timeout(200)
        # the notebooks' tables, as in JupyterLab: no NaN where a dash belongs
        if path.parent.name == "lessons":
            errors += [f"NaN in a table: {row}" for row in page.evaluate(MISSING_CELLS, "article")]
        if errors:
            failed[str(path.relative_to(SITE))] = errors
        page.close()
    assert not failed, failed


def test_the_chart_checks_fail_where_they_should(browser):
    """The notebooks' checks find a NaN cell and a cut label on a page made to have both (and nothing on a
    clean one): they can fail."""
    page = browser.new_page()
    page.set_content("""<div class="jp-OutputArea-output"><table><thead><tr><th>category</th><th>formula</th></tr>
        </thead><tbody><tr><td>temporary</td><td>NaN</td></tr><tr><td>parameter</td><td>16Ψ</td></tr></tbody></table>
        <div class="widget-inline-hbox"><label class="widget-label" style="display:block; width:40px;
        overflow:hidden; white-space:nowrap">ZeRO-Offload (optimizer states on the host)</label>
        <label class="widget-label" style="display:block; width:200px">stage</label></div></div>""")
    assert page.evaluate(MISSING_CELLS, ".jp-OutputArea-output") == [
        "temporary | NaN  [category | formula]"
    ]
    cut = page.evaluate(CUT_LABELS)
    assert len(cut) == 1 and cut[0].startswith("ZeRO-Offload"), cut
    page.close()


@pytest.mark.parametrize(
    "fault",
    ["a broken link", "a page the nav names that is not there", "a page the nav leaves out"],
)
def test_the_build_is_strict(tmp_path, fault):
    """The site's own configuration (mkdocs.yml, through scripts/build_docs.py) on two small pages, with one
    fault each: the build fails, naming it; without the fault it passes."""
    from build_docs import build, site_config  # scripts/ is on the path (the root conftest.py)

    def attempt(with_fault: bool):
        src = tmp_path / ("faulty" if with_fault else "clean") / "src"
        src.mkdir(parents=True)
        (src / "index.md").write_text("# Home\n\nSee [the other page](other.md).\n")
        (src / "other.md").write_text("# Other\n\nBack [home](index.md).\n")
        (src / "extra.md").write_text("# Extra\n")
        nav = ["index.md", "other.md", "extra.md"]
        if with_fault and fault == "a broken link":
            (src / "other.md").write_text("# Other\n\nSee [a page that is gone](gone.md).\n")
        if with_fault and fault == "a page the nav names that is not there":
            nav.append("missing.md")
        if with_fault and fault == "a page the nav leaves out":
            nav.remove("extra.md")
        return build(site_config({}, src=src, site=src.parent / "site", nav=nav), capture=True)

    assert attempt(with_fault=False).returncode == 0
    faulty = attempt(with_fault=True)
    assert faulty.returncode != 0, f"{fault}: the build passed"
    named = {
        "a broken link": "gone.md",
        "a page the nav names that is not there": "missing.md",
        "a page the nav leaves out": "extra.md",
    }[fault]
    assert named in faulty.stdout + faulty.stderr, faulty.stderr[-2000:]
