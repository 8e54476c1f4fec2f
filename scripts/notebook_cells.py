"""Helpers for the notebook builders (scripts/build_notebook_*.py): cells from text, and writing a
notebook with outputs stripped into notebooks/ (or the folder WORKBENCH_NOTEBOOKS_OUT names:
tests/test_notebook_builders.py builds them there and compares them with the committed ones)."""

import os

import nbformat as nbf

KERNELSPEC = {"name": "workbench", "display_name": "Python (workbench)", "language": "python"}


def md(text: str):
    return nbf.v4.new_markdown_cell(text.strip())


def code(text: str):
    return nbf.v4.new_code_cell(text.strip())


def write(cells: list, name: str) -> None:
    nb = nbf.v4.new_notebook()
    nb.cells = cells
    # the kernel `make setup` installs into the venv (scripts/setup.sh): JupyterLab and nbmake start that venv's
    # Python, whatever other kernels the machine has
    nb.metadata["kernelspec"] = KERNELSPEC
    folder = os.environ.get("WORKBENCH_NOTEBOOKS_OUT") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "notebooks"
    )
    nbf.write(nb, os.path.join(folder, name))
