"""The one exception type that reaches the user as a single line (see rlhf.stage.cli.run_stage)."""


class UserError(Exception):
    """Bad input or configuration: the message names the problem and the fix, no traceback."""


def raise_all(problems: list[str], what: str) -> None:
    """One UserError for every problem found, each said once: the problem itself when there is one, else
    "<count> <what>: <first> | <second> | ..."."""
    problems = list(dict.fromkeys(problems))
    if len(problems) == 1:
        raise UserError(problems[0])
    if problems:
        raise UserError(f"{len(problems)} {what}: " + " | ".join(problems))
