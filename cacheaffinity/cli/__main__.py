"""``python -m cacheaffinity.cli``: the ``cacheaffinity`` command."""

from cacheaffinity.cli import main

if __name__ == "__main__":
    main()
