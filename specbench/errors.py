"""The one exception type users see: its message is printed as a single line, exit code 2."""


class SpecbenchError(Exception):
    """Bad input or an unusable environment, explained in one line for the user."""
