"""The lease in Redis: connecting, the Lua scripts, the keeper, and the journal of runs."""
