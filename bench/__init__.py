"""Study scripts: one-off measurements behind figures in docs/results.md, each run from the repository root as
`.venv/bin/python -m bench.NAME` (docs/bench.md). They may import the installed `nightshift`, each other and
bench/helpers, never the tests; the tests import what they share from here. Nothing in the package imports them."""
