"""Test and benchmark infrastructure: real external services (XRootD, XCache) for cacheaffinity.

Nothing here is imported by the package itself; see :mod:`testbed.xrootd`.
"""

import os


def skip_or_fail(reason: str) -> None:
    """Skip a test whose system part (XRootD, Slurm, chromium, root for mounts) is missing.

    ``.ci/install-system-deps`` installs all of them and CI runs as root, so under CI
    (``CI`` set) a missing part is a failure, never a skip; elsewhere (a laptop without
    root) the test is skipped with the reason and the fix.
    """
    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI installs it: bash .ci/install-system-deps, as root)")
    pytest.skip(reason)
