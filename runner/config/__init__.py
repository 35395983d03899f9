"""Settings: built once at the CLI edge from flags and CRON_RUNNER_* variables, then passed down."""
