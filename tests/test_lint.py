"""`snakemake --lint` finds nothing to report: the workflow catalog lists only workflows that lint clean."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, env


@pytest.mark.workflow
def test_snakemake_lint_is_clean():
    run = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint"],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Lints for" not in run.stdout + run.stderr
