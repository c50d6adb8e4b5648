"""The client library's errors; ``tritonclient`` exception types never reach the caller."""


class EmbedClientError(Exception):
    """Base class of every error the client library raises."""


class InvalidInputError(EmbedClientError, ValueError):
    """The server (or the client) rejected the input; the message says what and why."""


class ServerUnavailableError(EmbedClientError, ConnectionError):
    """The server cannot be reached or the model is not ready."""


class EmbedTimeoutError(EmbedClientError, TimeoutError):
    """A request exceeded its deadline (``timeout_s``)."""
