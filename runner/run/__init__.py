"""One run: its phases, its policy, its targets and what observes it."""
