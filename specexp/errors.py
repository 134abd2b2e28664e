"""User-facing errors: one line, no traceback, raised before anything is lost."""

from __future__ import annotations


class SpecexpError(Exception):
    """An error the user can fix; the CLI prints it as one line and exits 2."""


class ConfigError(SpecexpError):
    """A bad override, unknown key, wrong type or inconsistent setting."""


class ValidationFailed(SpecexpError):
    """vLLM's own parser or config classes rejected a launch plan."""


class LaunchError(SpecexpError):
    """The server could not be started or did not become ready."""


class SuiteFailed(SpecexpError):
    """A variant regressed on the functional suite and ``suite.fail_fast`` stopped it."""
