"""The one exception type the CLI turns into a one-line message instead of a traceback."""


class UserError(Exception):
    """Bad input or an unsupported setup; the message names the value and the fix."""
