"""The bad-input suite (issue 14): every bad input a user can give reaches them as one line that names
the problem and the fix, with no traceback and no output left looking complete."""
