"""Queue mode: Dramatiq producers, workers and their bookkeeping."""
