"""The scheduler service: APScheduler with a SQLite job store, a persistent run queue, one worker, a control socket."""
