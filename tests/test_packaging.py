"""`pip install -e .` and Spaces' `pip install -r requirements.txt` must install the same things."""

from __future__ import annotations

import tomllib

from conftest import ROOT


def test_pyproject_declares_what_requirements_txt_installs():
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    required = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(project["dependencies"]) == required
    assert project["scripts"]["speclens"] == "decoding.tools.cli:main"
