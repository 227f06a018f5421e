"""Test and benchmark infrastructure: real external services (XRootD, XCache) for cacheaffinity.

Nothing here is imported by the package itself; see :mod:`cacheaffinity.testing.xrootd`.
"""
