"""The Textual dashboard: live figures, the job queue, reports and benchmark runs (`nightshift dashboard`)."""
