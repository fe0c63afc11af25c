"""``ConfigError``: the one error a run's configuration raises, from any check or probe.

Its message speaks in the config's field names, written `like_this`; the command line
turns them into the flags a user typed (`n_head` -> --n-head, ``cli_checks.as_flags``)
and prints ``minipar COMMAND: <message>``, exit 2, one line.
"""


class ConfigError(ValueError):
    """A configuration that cannot run; the message says what to change."""
