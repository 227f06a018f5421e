"""``python -m cacheaffinity.cli``: the ``cacheaffinity`` command."""

from cacheaffinity.cli import main

main()
