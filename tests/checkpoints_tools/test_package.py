"""What the installed package holds: tools, not test fixtures."""

from __future__ import annotations

import importlib.util

import checkpoints_tools


def test_the_package_ships_no_test_fixture() -> None:
    # the synthetic-checkpoint writer lives in tests/fixtures, imported by tests and benchmarks
    assert importlib.util.find_spec("checkpoints_tools.synthetic") is None
    assert checkpoints_tools.__doc__ and "issue" not in checkpoints_tools.__doc__
