"""Errors every command shares."""


class UsageError(Exception):
    """Bad input from the user: printed as one line naming the problem, exit status 2."""
