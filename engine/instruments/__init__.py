"""Instruments: the drive monitor (and, later, barrier trace, config assertions, run catalogue)."""
