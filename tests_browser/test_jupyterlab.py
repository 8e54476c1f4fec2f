"""The notebooks as a learner sees them: JupyterLab in a real browser (Debian's chromium, driven by
Playwright), every cell run, the charts and widgets rendered, a slider that changes its chart, no table cell
showing NaN, no control's label cut.

`make test-browser` installs chromium (apt-get) and Playwright's Python package, then runs this file;
`.ci/run` calls it after `make test`. Screenshots are kept under traces/browser/ for people to look at.
Playwright cannot download its own browsers here: the system chromium is launched by its path
(WORKBENCH_CHROMIUM, default /usr/bin/chromium).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from tests_browser.charts import (
    interleaved_controls_agree_with_the_chart,
    log_axes_hold_their_data,
    marks_use_their_legend_colours,
    no_missing_values_in_tables,
    ring_slider_keeps_its_title,
    widget_labels_fit,
    young_daly_axes_hold_the_curve,
    yours_beside_the_reference,
)
from tests_browser.conftest import CHROMIUM, SHOTS

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from exercise_answers import fill  # noqa: E402

TOKEN = "workbench-browser-test"
#: every notebook, each opened, run, a control moved, saved and reopened
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
#: JupyterLab settings for a quiet, fully rendered notebook: every cell in the DOM, no news pop-up
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"no chromium at {CHROMIUM} (make test-browser)"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on 127.0.0.1 (a free port), serving a copy of notebooks/ (so that its autosave never
    writes outputs into the checkout; their runs go to the copy's ../traces): its URL and its log."""
    from workbench.launching.lifetime import die_with_parent, stop

    tmp = tmp_path_factory.mktemp("lab")
    shutil.copytree(ROOT / "notebooks", tmp / "notebooks")
    # the exercises notebook with its answers filled in, as under nbmake: the checks pass and draw
    # the learner's timeline beside the reference's (shipped, its cells are empty)
    for path in (tmp / "notebooks").glob("*.ipynb"):
        nbformat.write(fill(nbformat.read(path, 4)), path)
    for name, value in SETTINGS.items():
        path = tmp / "settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    port = _free_port()
    log = open(tmp / "lab.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            f"--IdentityProvider.token={TOKEN}",
            f"--ServerApp.root_dir={tmp / 'notebooks'}",
            f"--LabApp.user_settings_dir={tmp / 'settings'}",
            "--LabApp.expose_app_in_browser=True",
            f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
        ]
        + (["--allow-root"] if os.geteuid() == 0 else []),  # CI containers run as root
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        preexec_fn=die_with_parent,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                stop(proc)
                raise AssertionError(
                    "JupyterLab did not start: " + (tmp / "lab.log").read_text()[-3000:]
                ) from None
            time.sleep(0.5)
    yield Lab(url, tmp / "lab.log")
    stop(proc, grace_s=10)


@dataclass(frozen=True)
class Lab:
    url: str
    log: Path

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


KERNEL_READY = """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
                           const s = w && w.sessionContext && w.sessionContext.session;
                           const k = s && s.kernel;
                           return !!k && k.connectionStatus === 'connected' && k.status === 'idle'; }"""
SHUT_DOWN_KERNEL = "() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()"
#: the notebook's progress: each code cell's prompt (`[3]:` ran, `[*]:` running or queued, `[ ]:` not
#: asked), the first traceback shown (a cell raised; JupyterLab draws an error as stderr) and the kernel's status
PROGRESS = """() => { const w = window.jupyterapp.shell.currentWidget;
                    const ps = [...w.node.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]
                      .map(p => p.textContent.trim());
                    const err = [...w.node.querySelectorAll(
                      '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
                      .find(o => o.textContent.includes('Traceback'));
                    const k = w.sessionContext.session?.kernel;
                    return {prompts: ps, error: err ? err.textContent : null, kernel: k ? k.status : 'none'}; }"""


def _run_all(page, lab: Lab, timeout_s: float) -> None:
    """Run all cells once the kernel is connected and idle (JupyterLab's own command, through the app the
    server exposes), then wait until every code cell has an execution count. Clicking Run ▸ Run All while
    the kernel was still connecting ran nothing: the cells stayed `[ ]`.

    It stops at once, saying why, when a cell raises (JupyterLab then drops the cells queued after it, which
    stay `[ ]` for good: waiting for them only spent the whole timeout and said nothing of the cause) or when
    nothing runs any more (a kernel that died or restarted: the server's log tail is in the message)."""
    page.wait_for_function(KERNEL_READY, timeout=120_000, polling=500)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    deadline, idle_since = time.monotonic() + timeout_s, None
    while True:
        state = page.evaluate(PROGRESS)
        prompts = state["prompts"]
        ran = sum(bool(re.fullmatch(r"\[\d+\]:", p)) for p in prompts)
        if prompts and ran == len(prompts):
            return
        why = None
        if state["error"] is not None:
            why = f"code cell {ran} of {len(prompts)} raised:\n{state['error'][-3000:]}"
        elif "[*]:" not in prompts and state["kernel"] == "idle":
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since > 15:
                why = (
                    f"nothing runs any more (kernel idle, prompts {prompts}); the server's log ends:\n"
                    f"{lab.log_tail()}"
                )
        else:
            idle_since = None
        if why is None and time.monotonic() > deadline:
            why = f"Run All did not finish in {timeout_s:.0f} s; prompts: {prompts}; kernel {state['kernel']}"
        if why is not None:
            page.screenshot(path=str(SHOTS / "run-all-stopped.png"), full_page=True)
            raise AssertionError(why)
        time.sleep(1)


def _chart_svg(output) -> str:
    return output.locator(".js-plotly-plot .main-svg").first.inner_html()


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_the_notebook_runs_and_renders_in_jupyterlab(lab, browser, notebook):
    SHOTS.mkdir(parents=True, exist_ok=True)
    stem = notebook.removesuffix(".ipynb")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    console_errors: list[str] = []
    page.on(
        "console",
        lambda m: console_errors.append(f"{m.text} @ {m.location}") if m.type == "error" else None,
    )
    # a workspace of its own, reset: only this notebook open (a shared one reopened the previous tab)
    page.goto(f"{lab.url}/lab/workspaces/{stem}/tree/{notebook}?reset&token={TOKEN}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    _run_all(page, lab, timeout_s=float(os.environ.get("WORKBENCH_RUN_ALL_S", 600)))
    page.wait_for_timeout(2000)  # the last widgets draw
    page.screenshot(path=str(SHOTS / f"{stem}.png"))
    stderr = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
    assert page.locator(stderr, has_text="Traceback").count() == 0, "a cell raised"
    assert "Error displaying widget" not in page.content()
    assert page.locator(".js-plotly-plot").count() >= 2, "plotly charts rendered"
    marks_use_their_legend_colours(page)
    log_axes_hold_their_data(page)
    no_missing_values_in_tables(page)
    widget_labels_fit(page)
    if notebook not in NO_CONTROL:
        _a_control_moves_its_chart(page, stem)
    for check in EXTRA_CHECKS.get(notebook, ()):
        check(page, stem)
    (SHOTS / f"{stem}-console.txt").write_text("\n\n".join(console_errors))
    assert not [e for e in console_errors if "favicon" not in e], console_errors
    _saved_notebook_reopens_clean(page, browser, lab, notebook)


#: each output that shows "Error displaying widget": its cell's number, the model it names and the source's first line
BROKEN_WIDGETS = """() => {
    const cells = [...document.querySelectorAll('.jp-Notebook .jp-Cell')];
    return cells.flatMap((cell, i) => [...cell.querySelectorAll('.jp-OutputArea-output')]
        .filter(o => o.innerText.includes('Error displaying widget'))
        .map(o => `cell ${i}: ${o.innerText.trim()} (${(cell.querySelector('.jp-InputArea-editor')?.innerText
                   || '').split('\\n')[0].slice(0, 80)})`));
}"""


def _saved_notebook_reopens_clean(page, browser, lab: Lab, notebook: str) -> None:
    """Save, shut the kernel down, open the notebook again: its outputs (progress lines, charts, widgets
    from their saved state) show without "Error displaying widget" or console errors. The save waits for the
    kernel to finish what the last moved control asked (its new widgets' models must exist to be saved).
    The saved file holds every widget its outputs show, and its widget state stays small
    (`_saved_widget_state`)."""
    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel?.status"
        " === 'idle'",
        timeout=120_000,
    )
    page.wait_for_timeout(1500)  # the last comm messages (new widget models) reach the page
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function(
        "() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000
    )
    page.evaluate(SHUT_DOWN_KERNEL)
    page.close()
    _saved_widget_state(lab, notebook)
    stem = notebook.removesuffix(".ipynb")
    again = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    again.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    again.goto(f"{lab.url}/lab/workspaces/{stem}-reopened/tree/{notebook}?reset&token={TOKEN}")
    broken = _widgets_restored(again)
    if broken and all("model not found" in b for b in broken):
        # JupyterLab's widget manager (jupyterlab-manager 5.0) restores twice on opening: the notebook's saved
        # state, whose set_state first waits for a comm-info reply from the new kernel, and, once the kernel
        # connects, the kernel's own widgets. The second can finish first and mark the manager restored before
        # the saved models are registered; an output rendered in between shows "model not found" for good.
        # Every model shown is in the saved state (_saved_widget_state, above), so that is the race: a reload
        # (as a user would) must then show every widget.
        # the race's own; any other stays
        errors[:] = [e for e in errors if "widget model not found" not in e]
        again.reload()
        broken = _widgets_restored(again)
    again.screenshot(path=str(SHOTS / f"{stem}-reopened.png"))
    assert not broken, (
        f"a saved widget did not come back: {broken}; console: "
        f"{[e for e in errors if 'favicon' not in e]}"
    )
    assert not [e for e in errors if "favicon" not in e], errors
    again.evaluate(SHUT_DOWN_KERNEL)
    again.close()


def _widgets_restored(page) -> list[str]:
    """Wait until the reopened notebook's widgets have been restored (or given up on); the outputs that show
    "Error displaying widget" (`BROKEN_WIDGETS`)."""
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    # a saved chart shows as its saved image until plotly.js draws it live (JupyterLab's plotly renderer
    # does that lazily, and for a chart below the first screen not before it is scrolled to): either counts
    page.wait_for_selector(
        ".js-plotly-plot, .jp-RenderedPlotly .plot-img", state="attached", timeout=120_000
    )
    # each widget output reads "Loading widget..." until JupyterLab's widget manager has restored its model
    # from the saved state (or given up: "Error displaying widget"); a fixed wait could look before it did
    page.wait_for_function(
        "() => !document.body.innerText.includes('Loading widget...')", timeout=120_000, polling=500
    )
    page.wait_for_timeout(1000)
    return page.evaluate(BROKEN_WIDGETS)


#: the most widget state a saved notebook may carry: an explorer saves its controls and the chart it shows
#: (notebook 04's, the largest: about 0.3 MB). A plotly FigureWidget saved plotly.js itself, 5.1 MB, and a
#: reopened notebook then had to evaluate it before the widget could show (widgets.py says more).
MAX_WIDGET_STATE_BYTES = 2_000_000


def _saved_widget_state(lab: Lab, notebook: str) -> None:
    """The notebook as saved (the server's contents API): each widget an output shows is in its saved
    widget state, so a widget that does not come back on reopening is JupyterLab's to restore, not a
    save that missed it; and that state is under MAX_WIDGET_STATE_BYTES."""
    with urllib.request.urlopen(
        f"{lab.url}/api/contents/{notebook}?token={TOKEN}", timeout=30
    ) as r:
        saved = json.load(r)["content"]
    state = (
        saved["metadata"]
        .get("widgets", {})
        .get("application/vnd.jupyter.widget-state+json", {})
        .get("state", {})
    )
    shown = {
        o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
        for c in saved["cells"]
        for o in c.get("outputs", ())
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    }
    assert shown <= set(state), f"widgets shown but not saved: {sorted(shown - set(state))}"
    size = len(json.dumps(state))
    assert size < MAX_WIDGET_STATE_BYTES, (
        f"{notebook} saves {size / 1e6:.1f} MB of widget state; the largest models: "
        f"{sorted(((len(json.dumps(m)), m['model_name']) for m in state.values()), reverse=True)[:3]}"
    )


def _a_control_moves_its_chart(page, stem: str) -> None:
    """The first ipywidgets slider whose output also holds a chart (an explorer, a step slider over a
    timeline): move it, and the chart changes. A notebook without one moves a plotly slider instead (the
    ring replays): its chart must change too."""
    sliders = page.locator(".jp-OutputArea-output:has(.widget-slider):has(.js-plotly-plot)")
    if sliders.count() == 0:
        _a_plotly_slider_moves(page, stem)
        return
    output = sliders.first
    output.scroll_into_view_if_needed()
    before = _chart_svg(output)
    output.screenshot(path=str(SHOTS / f"{stem}-slider-before.png"))
    handle = output.locator(".widget-slider .noUi-handle").first
    handle.focus()
    for key in ("ArrowLeft", "ArrowRight"):  # a slider that starts at its minimum moves right
        for _ in range(3):
            handle.press(key)
        page.wait_for_timeout(3000)
        if _chart_svg(output) != before:
            break
    output.screenshot(path=str(SHOTS / f"{stem}-slider-after.png"))
    assert _chart_svg(output) != before, "moving the slider changed the chart"


def _a_plotly_slider_moves(page, stem: str) -> None:
    charts = page.locator(".js-plotly-plot:has(.slider-rail-rect)")
    assert charts.count() >= 1, "an ipywidgets slider beside a chart, or a chart with a slider"
    chart = charts.first
    chart.scroll_into_view_if_needed()
    before = chart.locator(".main-svg").first.inner_html()
    rail = chart.locator(".slider-rail-rect").first.bounding_box()
    page.mouse.click(rail["x"] + rail["width"] - 2, rail["y"] + rail["height"] / 2)
    page.wait_for_timeout(1500)
    chart.screenshot(path=str(SHOTS / f"{stem}-plotly-slider.png"))
    assert chart.locator(".main-svg").first.inner_html() != before, (
        "moving the chart's slider changed it"
    )


EXTRA_CHECKS = {
    "01_data_parallel.ipynb": (ring_slider_keeps_its_title,),
    "03_pipeline_parallel.ipynb": (interleaved_controls_agree_with_the_chart,),
    "08_fault_tolerance.ipynb": (young_daly_axes_hold_the_curve,),
    "13_exercises.ipynb": (yours_beside_the_reference,),
}
#: notebooks with no control to move, and why
NO_CONTROL = {
    "13_exercises.ipynb": "its charts are the checks' results (a learner's code beside the reference), "
    "drawn once per check: what changes them is the learner's code, not a slider",
}


def test_figures_export_as_images():
    """plotly's write_image (kaleido, driving this chromium) works: figures can leave the notebook."""
    import plotly.graph_objects as go

    os.environ.setdefault("BROWSER_PATH", CHROMIUM)
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / "export.png"
    go.Figure(go.Bar(x=["DP", "ZeRO-3"], y=[16, 2])).write_image(str(path))
    assert path.stat().st_size > 1000


def test_run_all_stops_at_a_cell_that_raises(lab, browser):
    """The harness's own check can fail, and fails fast: a notebook whose second cell raises stops Run All
    there, and the failure names that cell and its error (not a timeout ten minutes later)."""
    cells = [
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": src}
        for src in ("x = 1", "raise ValueError('the second cell fails')", "y = 2")
    ]
    content = {
        "cells": cells,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    body = json.dumps({"type": "notebook", "format": "json", "content": content}).encode()
    request = urllib.request.Request(
        f"{lab.url}/api/contents/raises.ipynb?token={TOKEN}",
        data=body,
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=30).close()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{lab.url}/lab/workspaces/raises/tree/raises.ipynb?reset&token={TOKEN}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    started = time.monotonic()
    with pytest.raises(
        AssertionError, match=r"code cell 2 of 3 raised:(.|\n)*the second cell fails"
    ):
        _run_all(page, lab, timeout_s=120)
    assert time.monotonic() - started < 60
    page.evaluate(SHUT_DOWN_KERNEL)
    page.close()
