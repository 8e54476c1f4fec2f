"""`make notebooks-html`: every notebook executed and written as HTML with its charts interactive, to read
before running anything (traces/html/NN_name.html). nbconvert's executor is nbclient: the channel fix of
scripts/nbclient_poll.py is installed first, or each widget cell could wait out the cell timeout."""

from __future__ import annotations

import glob
import os
import sys

from nbclient_poll import install

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(out_dir: str = os.path.join(ROOT, "traces", "html")) -> None:
    install()
    os.environ.setdefault("PLOTLY_RENDERER", "notebook")  # plotly.js inside each page: opens offline
    import nbformat
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import ExecutePreprocessor

    os.makedirs(out_dir, exist_ok=True)
    names = sys.argv[1:] or sorted(glob.glob(os.path.join(ROOT, "notebooks", "[0-9][0-9]_*.ipynb")))
    for path in names:
        nb = nbformat.read(path, as_version=4)
        ExecutePreprocessor(timeout=900).preprocess(nb, {"metadata": {"path": os.path.dirname(path)}})
        html, _ = HTMLExporter().from_notebook_node(nb)
        target = os.path.join(out_dir, os.path.basename(path).removesuffix(".ipynb") + ".html")
        with open(target, "w") as f:
            f.write(html)
        print(f"{target}: {len(html) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
