"""The version (a leaf module: submodules name it without importing the package root)."""

__version__ = "0.1.0"
