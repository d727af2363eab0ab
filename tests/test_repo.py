"""Structure of the files a user runs without our Python: Dockerfile, shell entry points, requirements."""

import re

from conftest import REPO


def test_dockerfile_installs_what_ci_tests():
    """The image runs the Python and the pinned requirements CI tests, torch included (PyPI's Linux wheel is the
    CUDA build), rather than a base image's own torch."""
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)", text, re.M).group(1)
    assert base == "python:3.11-slim"  # the Python CI runs the tests on
    assert re.search(r"^FROM \$\{BASE_IMAGE\}", text, re.M)
    assert "pip install -r requirements.txt" in text and "grep -v" not in text  # the torch pin is kept
    assert "RLHF_NO_VENV=1" in text  # run_all.sh uses the image's interpreter instead of making a venv
    assert re.search(r'^CMD \["bash", "run_all.sh", "--preset", "gpt2-hh"\]', text, re.M)
    copy_all = text.index("COPY . .")
    assert text.index("pip install -r") < copy_all  # dependency layer cached across code edits


def test_requirements_pin_every_dependency_to_a_tested_range():
    # a pin may be followed by a Python-version marker (a package that exists only for newer Pythons)
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            assert re.match(r'^[A-Za-z0-9_.-]+(==[\w.]+|>=[\w.]+,<[\w.]+)(; python_version >= "[\d.]+")?$', line), line


def test_entry_points_bootstrap_the_environment_and_ci_calls_the_tests():
    for script in ("run_all.sh", "run_tests.sh"):
        text = (REPO / script).read_text()
        assert "source scripts/env.sh" in text and "set -euo pipefail" in text
    assert "bash run_tests.sh" in (REPO / ".ci" / "run").read_text()
