"""The renderers of tools/render_readme.py, by topic (its ``RENDERERS`` table names them)."""
