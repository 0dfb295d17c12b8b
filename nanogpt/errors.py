"""The one exception a user can fix: scripts print it as one line and exit with code 2 (program.run_main)."""


class UserError(Exception):
    """A mistake the user can fix: scripts print it as one line and exit with code 2."""
