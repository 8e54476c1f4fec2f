"""`make docs`: the documentation site, built without the network into traces/site/ (open traces/site/index.html).

1. docs/ is copied into traces/site_src/ as written (the guides, the architecture, the formulas, the run format),
   but for its links to notebooks/, which lead to their pages; the README becomes the home page, its links made
   relative to the site;
2. the CLI reference is generated from the parser (`workbench --help`, each subcommand's, and `workbench run
   --help`, which tyro writes from RunConfig), and the API reference's pages name each module for mkdocstrings,
   which reads the docstrings;
3. every notebook, executed (scripts/executed_notebooks.py: the copy `make test` kept, else executed now), becomes a
   page: each plotly chart a div drawn by the site's one copy of plotly.js, each ipywidgets control a note that
   it moves in Jupyter (its scripts would need the network), followed by the charts its Output widgets showed;
   a prediction's box a note, its answer the closed fold it is;
4. docs/lessons.md's claims ledger is written again from the notebooks just executed (scripts/claims_ledger.py),
   with this run's margins; a committed ledger that lists other claims than the notebooks check fails the build;
5. mkdocs.yml's nav gets the generated pages, and `mkdocs build --strict` builds it: a broken link, a page missing
   from the nav or a docstring mkdocstrings cannot read fails the build.

    python scripts/build_docs.py [--fresh]     # --fresh: execute every notebook again
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import html
import io
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import claims_ledger
import nbformat
import yaml
from executed_notebooks import ROOT, executed
from exercise_answers import exercise_of

SRC = ROOT / "traces" / "site_src"
SITE = ROOT / "traces" / "site"
WIDGET = "application/vnd.jupyter.widget-view+json"
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_NOTE = (
    '<p class="wb-widget"><em>An interactive control (ipywidgets): it moves when the notebook runs in '
    "Jupyter — <code>make notebook</code>. {shown}</em></p>"
)


#: viz.predict's box on a page: a note (a prediction is typed in Jupyter); its answer is an HTML fold, shown as it is
PREDICTION_WIDGETS = {
    "TextModel": lambda state: (
        '<p class="wb-predict"><em>A box for your prediction: type a number when the '
        "notebook runs in Jupyter (<code>make notebook</code>); here, predict in your "
        "head, then open the answer below.</em></p>"
    ),
}


def cli_reference() -> str:
    """The `workbench` command's help, every subcommand's, and `workbench run`'s flags, as the parser prints them."""
    os.environ.update(COLUMNS="110", NO_COLOR="1", TERM="dumb")
    from workbench.cli import slurm_command
    from workbench.cli.parser import build_parser
    from workbench.cli.run_command import parse_run

    parser = build_parser()
    parts = [
        "# The `workbench` command",
        "",
        "Generated from the parser by `make docs` (scripts/build_docs.py): what `--help` prints.",
        "",
        "```text",
        parser.format_help().rstrip(),
        "```",
        "",
    ]
    run_help = io.StringIO()
    with contextlib.redirect_stdout(run_help), contextlib.suppress(SystemExit):
        parse_run(["--help"])
    parts += [
        "## workbench run",
        "",
        "Every `RunConfig` field is a flag (tyro writes them from the dataclass).",
        "",
        "```text",
        run_help.getvalue().rstrip(),
        "```",
        "",
    ]
    (subparsers,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    for name, sub in subparsers.choices.items():
        if name == "slurm-script":  # parses its own options, then workbench run's flags
            parts += [f"## workbench {name}", "", "```text", slurm_command.help_text(), "```", ""]
        elif name != "run":
            parts += [f"## workbench {name}", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(parts)


def api_reference(dst: Path) -> list:
    """One page for `import workbench as wb`'s names and one per package, each module's docstring and members."""
    import workbench

    (dst / "reference" / "api").mkdir(parents=True, exist_ok=True)
    front = [
        "# `import workbench as wb`",
        "",
        "What the package's top level gives (each imported on first use).",
        "",
    ]
    # each where it is defined (imports no torch: the package promises it)
    for name in workbench.__all__:
        where = getattr(workbench, name).__module__
        front += [f"::: {where}.{name}", "    options:", "      show_root_full_path: false", ""]
    (dst / "reference" / "api" / "index.md").write_text("\n".join(front))
    nav = [{"API: wb": "reference/api/index.md"}]
    for package in pkgutil.iter_modules(workbench.__path__):
        if not package.ispkg:
            continue
        name = f"workbench.{package.name}"
        page = [f"# `{name}`", "", f"::: {name}", "    options:", "      members: false", ""]
        for module in pkgutil.walk_packages(
            [str(ROOT / "workbench" / package.name)], prefix=f"{name}."
        ):
            page += [f"::: {module.name}", ""]
        (dst / "reference" / "api" / f"{package.name}.md").write_text("\n".join(page))
        nav.append({name: f"reference/api/{package.name}.md"})
    return nav


def static_outputs(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Each plotly figure as HTML that the page's plotly.js draws; each widget as a note, followed by what its
    Output widgets showed when the notebook ran (an explorer's chart at its first setting); no widget state
    (whose scripts nbconvert would fetch from a CDN)."""
    state = nb.metadata.pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    nb.cells = [folded_answer(cell) if exercise_of(cell) else cell for cell in nb.cells]
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if PLOTLY in data:
                data["text/html"] = plotly_html(data.pop(PLOTLY))
            # viz.predict's reveal: no
            if "<details><summary>The answer" in "".join(data.get("text/html", "")):
                data["text/html"] = re.sub(
                    r"^<p>Type your prediction.*?</p>",
                    "",  # box to type in on a page
                    "".join(data["text/html"]),
                )
            if WIDGET in data:
                model = state.get(data[WIDGET]["model_id"], {})
                # viz.predict's box and its verdict line
                if model.get("model_name") in PREDICTION_WIDGETS:
                    output["data"] = {
                        "text/html": PREDICTION_WIDGETS[model["model_name"]](model["state"])
                    }
                    continue
                shown = widget_outputs_html(data[WIDGET]["model_id"], state)
                note = "Below, what it showed when the notebook ran." if shown else ""
                output["data"] = {"text/html": WIDGET_NOTE.format(shown=note) + shown}
    return nb


def folded_answer(cell: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """An exercise's cell, which ran with the reference answer: on the page, the answer folded away (a learner
    opens it after trying; the notebook itself ships the cell empty)."""
    return nbformat.v4.new_markdown_cell(
        "<details><summary>The reference answer (open it after you have written yours)</summary>"
        f"<pre><code>{html.escape(cell.source)}</code></pre></details>"
    )


def plotly_html(figure: dict) -> str:
    """A figure as the kernel's plotly wrote it (no need to validate it again), as a div the page's plotly.js draws."""
    import plotly.io as pio

    return pio.to_html(
        figure, include_plotlyjs=False, full_html=False, validate=False, config={"responsive": True}
    )


def widget_outputs_html(model_id: str, state: dict) -> str:
    """What a widget's Output widgets hold in the saved widget state, as HTML, found through the boxes that
    contain them (a VBox's `children` name their models `IPY_MODEL_<id>`): plotly charts, HTML and text. The
    controls themselves are left out: without a kernel they would move nothing."""
    model = state.get(model_id)
    if model is None:
        return ""
    parts = [
        widget_outputs_html(child.removeprefix("IPY_MODEL_"), state)
        for child in model["state"].get("children", [])
    ]
    for output in model["state"].get("outputs", []):
        data = output.get("data", {})
        if PLOTLY in data:
            parts.append(plotly_html(data[PLOTLY]))
        elif "text/html" in data:
            parts.append("".join(data["text/html"]))
        elif output.get("output_type") == "stream" or "text/plain" in data:
            parts.append(
                f"<pre>{html.escape(''.join(output.get('text') or data.get('text/plain', '')))}</pre>"
            )
    return "".join(parts)


def lesson_pages(dst: Path, fresh: bool) -> list:
    (dst / "lessons").mkdir(parents=True, exist_ok=True)
    nav = []
    for path in sorted(glob.glob(str(ROOT / "notebooks" / "[0-9][0-9]_*.ipynb"))):
        nb = static_outputs(executed(path, fresh=fresh))
        name = Path(path).name
        nbformat.write(nb, dst / "lessons" / name)
        nav.append(f"lessons/{name}")
    scripts = dst / "assets" / "javascripts"
    scripts.mkdir(parents=True, exist_ok=True)
    import plotly

    shutil.copy(
        Path(plotly.__file__).parent / "package_data" / "plotly.min.js", scripts / "plotly.min.js"
    )
    return nav


def site_config(
    generated: dict[str, list], src: Path = SRC, site: Path = SITE, nav: list | None = None
) -> Path:
    """mkdocs.yml with its nav's GENERATED entries filled in (or another nav) and its paths absolute, written
    beside `src` (traces/mkdocs.built.yml)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def fill(entries: list) -> list:
        out = []
        for entry in entries:
            if isinstance(entry, str) and entry.startswith("GENERATED "):
                out += generated[entry.split()[1]]
            elif isinstance(entry, dict):
                out.append({k: fill(v) if isinstance(v, list) else v for k, v in entry.items()})
            else:
                out.append(entry)
        return out

    config["nav"] = fill(config["nav"]) if nav is None else nav
    config["docs_dir"], config["site_dir"] = str(src), str(site)
    config["theme"]["custom_dir"] = str(ROOT / config["theme"]["custom_dir"])
    (docstrings,) = [
        p["mkdocstrings"] for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p
    ]
    docstrings["handlers"]["python"]["paths"] = [str(ROOT)]
    target = src.parent / "mkdocs.built.yml"
    target.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return target


def notebook_links_to_lessons(text: str, folder: Path) -> str:
    """A docs page's links to a notebook of the repository (`../notebooks/01_data_parallel.ipynb` from docs/, which
    read on GitHub opens the notebook) lead to its executed page instead (`lessons/01_data_parallel.ipynb`, from
    the site's root; `folder` is the page's, relative to it)."""
    up = "../" * (len(folder.parts) + 1)
    lessons = "../" * len(folder.parts) + "lessons/"
    return re.sub(rf"\]\({re.escape(up)}notebooks/(\d\d_\w+\.ipynb)\)", rf"]({lessons}\1)", text)


def build(config: Path, capture: bool = False) -> subprocess.CompletedProcess:
    """`mkdocs build --strict`: any warning — a broken link, a page missing from the nav or from the disk, a
    docstring mkdocstrings cannot read — fails it."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=capture,
        text=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh", action="store_true", help="execute every notebook again")
    args = parser.parse_args()
    shutil.rmtree(SRC, ignore_errors=True)
    shutil.copytree(ROOT / "docs", SRC)
    for page in SRC.rglob("*.md"):
        page.write_text(notebook_links_to_lessons(page.read_text(), page.parent.relative_to(SRC)))
    (SRC / "index.md").write_text((ROOT / "README.md").read_text().replace("](docs/", "]("))
    (SRC / "reference").mkdir()
    (SRC / "reference" / "cli.md").write_text(cli_reference())
    generated = {"api": api_reference(SRC), "lessons": lesson_pages(SRC, args.fresh)}
    rows = claims_ledger.all_claims()  # the executed copies lesson_pages just read or wrote
    problems = claims_ledger.stale((ROOT / "docs" / "lessons.md").read_text(), rows)
    if problems:
        print(
            "docs/lessons.md's claims ledger is stale (python scripts/claims_ledger.py writes it):\n  "
            + "\n  ".join(problems)
        )
        return 1
    (SRC / "lessons.md").write_text(
        claims_ledger.with_ledger((SRC / "lessons.md").read_text(), rows)
    )
    config = site_config(generated)
    shutil.rmtree(SITE, ignore_errors=True)
    done = build(config, capture=True)
    print(
        "\n".join(
            line for line in (done.stdout + done.stderr).splitlines() if not line.startswith("INFO")
        )
    )
    if done.returncode == 0:
        print(f"the site: {SITE / 'index.html'} (open it in a browser; no server needed)")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
