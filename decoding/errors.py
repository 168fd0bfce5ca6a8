"""Errors a user can cause and fix. The CLI prints them in one line; the UI shows them."""


class SpecLensError(ValueError):
    """Bad input or an environment problem, with a message meant for the user."""


class ModelNotFoundError(SpecLensError):
    pass


class HubUnreachableError(SpecLensError):
    pass


class ModelTooLargeError(SpecLensError):
    pass


class TraceError(SpecLensError):
    """A trace file that is not a valid SpecLens trace; the message names the first problem."""


def first_line(exc: BaseException) -> str:
    """A library's exception in one line, for a message that names what failed."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
