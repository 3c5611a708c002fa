"""Hypothesis profiles and a summary of the worst finite-difference error per check.

CI=true loads Hypothesis's derandomized `ci` profile; ours extends it. Pick another
with HYPOTHESIS_PROFILE=dev (quick) or HYPOTHESIS_PROFILE=thorough.
"""

from __future__ import annotations

import os

from hypothesis import settings

from parity_tests.helpers import COUNTS, WORST_ERRORS

settings.register_profile(
    "ci", parent=settings.get_profile("ci"), max_examples=60, deadline=None, print_blob=True
)
settings.register_profile("dev", max_examples=15, deadline=None, print_blob=True)
settings.register_profile("thorough", max_examples=500, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if WORST_ERRORS:
        terminalreporter.section("worst relative error seen per check")
        for name, error in sorted(WORST_ERRORS.items()):
            terminalreporter.write_line(f"{name:<40} {error:.2e}")
    for event, count in sorted(COUNTS.items()):
        terminalreporter.write_line(f"{event}: {count}")
