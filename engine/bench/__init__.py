"""Benchmark scenarios as a library: the decode, prefill, draft, cache and peer runs that `nightshift bench` and
`nightshift model tune` time and record (study scripts that print one-off figures live in the repository's bench/)."""
