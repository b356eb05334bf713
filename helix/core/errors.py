"""Errors meant for people.

A :class:`HelixUserError` is raised for bad input (a malformed spec, a model that does not fit, an
unknown option). The CLI prints its message as one line and exits non-zero; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations


class HelixUserError(Exception):
    """Bad input from a user: shown as one line, never with a traceback."""


class SpecError(HelixUserError):
    """A cluster or model spec is invalid. The message names the field and the bad value."""


class InfeasibleError(HelixUserError):
    """The cluster cannot serve the model at all (not enough memory, a region cut off, ...)."""


#: A worker's failure message that starts with this was the request's own fault (it was refused
#: as a user error, e.g. a response_format schema too complex to compile): HTTP 400, gRPC
#: INVALID_ARGUMENT, not a server error.
USER_FAILURE = "invalid request: "
