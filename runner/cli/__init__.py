"""The command line: parsing, the command table, and the one mapping of outcomes and errors to exit codes."""
