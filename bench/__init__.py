"""Study scripts: one-off measurements behind figures in docs/results.md, each run from the repository root as
`.venv/bin/python -m bench.NAME` (docs/bench.md). They may import the installed `nightshift` and each other; the
tests import what they share from here (a few older scripts still import tests/helpers: docs/bench.md). Nothing in
the package imports them."""
