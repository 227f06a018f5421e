# Repository root on sys.path so tests import the examples package.
