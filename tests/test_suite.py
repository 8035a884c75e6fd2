"""The suite's own machinery (tests/conftest.py)."""

from __future__ import annotations

import pytest
from conftest import claim_shared_run


def test_a_second_worker_asking_for_the_shared_run_fails(tmp_path):
    """Under pytest-xdist the tests of the shared run itself must share one worker (they change and restore
    it): the first worker's claim holds, another worker's fails."""
    claim = tmp_path / "shared_run.worker"
    claim_shared_run(claim, "gw0")
    with pytest.raises(pytest.fail.Exception, match="already used by worker gw0"):
        claim_shared_run(claim, "gw1")
    assert claim.read_text() == "gw0"
