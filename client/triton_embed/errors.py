"""The client library's errors; ``tritonclient`` exception types never reach the caller."""


class EmbedClientError(Exception):
    """Base class of every error the client library raises."""


class InvalidInputError(EmbedClientError, ValueError):
    """The input was rejected; the message says what and why.

    Raised when the server answers ``INVALID_ARG`` (gRPC ``INVALID_ARGUMENT``, HTTP 400:
    a text breaks the input contract, or a request option has a value outside those of
    :mod:`triton_embed.options`), and when the client refuses an argument before sending.
    """


class ServerUnavailableError(EmbedClientError, ConnectionError):
    """The server cannot be reached or the model is not ready."""


class EmbedTimeoutError(EmbedClientError, TimeoutError):
    """A request exceeded its deadline (``timeout_s``)."""


class AccessDeniedError(EmbedClientError, PermissionError):
    """The server refused a restricted API call: the admin key is missing or wrong.

    Reading a model's config and loading or unloading models need the admin key
    (:mod:`triton_embed.admin`); inference does not.
    """
