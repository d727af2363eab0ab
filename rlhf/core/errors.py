"""The one exception type that reaches the user as a single line (see rlhf.stage.cli.run_stage)."""


class UserError(Exception):
    """Bad input or configuration: the message names the problem and the fix, no traceback."""
