"""One error type for everything a user can get wrong: its message names the culprit."""


class TruthflowError(RuntimeError):
    """A user-facing failure (bad config, missing file, gated model). The message says what to fix."""
