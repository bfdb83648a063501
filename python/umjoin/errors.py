"""Errors caused by what the user asked for: the CLI prints the message alone and exits with 2."""


class UserError(Exception):
    """Bad input (file, SQL, table, option): the message names the problem and, where possible, the fix."""
