"""Scheduled reviews: schedules, data sources, reconciliation checks, prompts and PDF reports."""
