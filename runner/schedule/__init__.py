"""Schedules and slots: the cron language, Job-name slots, retention and missed slots."""
