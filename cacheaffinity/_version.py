"""The version of cacheaffinity (imported by any process; a leaf module, so that
submodules can name the version without importing the package root)."""

__version__ = "0.1.0"
