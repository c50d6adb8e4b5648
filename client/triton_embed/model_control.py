"""Loading and unloading models through Triton's model repository API, with the admin key.

Triton's model repository extension (gRPC ``RepositoryModelLoad`` / ``RepositoryModelUnload``)
loads a model of the server's repository, or reloads it after its files changed, and unloads
it; with ``--model-control-mode explicit`` nothing else does. Loading an ensemble loads its
steps; unloading it with ``unload_dependents`` unloads them too. The server restricts the API
to callers that send the admin key (:mod:`triton_embed.admin`).

:class:`ModelControl` needs no model to be ready (``triton-embed repository load`` loads
models that are not); :func:`load_model` and :func:`unload_model` work over any
``tritonclient.grpc.InferenceServerClient``.
"""

from __future__ import annotations

import time
from typing import Any

from triton_embed.admin import grpc_headers
from triton_embed.errors import EmbedClientError, EmbedTimeoutError, InvalidInputError, map_error
from triton_embed.transport.addresses import DEFAULT_URL, check_url
from triton_embed.transport.calls import ChannelOwner, admin_key_of

#: Seconds between readiness checks after a load or an unload.
READY_POLL_S = 0.2
#: The ensemble whose steps are named ``tokenizer`` and ``embedder`` (the shipped layout).
LEGACY_NAME = "embed"
#: The two step kinds, in ensemble order.
STEPS = ("tokenizer", "embedder")


#: Model kind -> the name suffix of its engine step (``repository add``'s naming rule).
ENGINE_STEPS = {
    "embedding": "embedder",
    "reranker": "scorer",
    "sparse": "sparse_encoder",
    "multivector": "token_encoder",
    "hybrid": "hybrid_encoder",
}


def step_names(name: str, kind: str = "embedding") -> tuple[str, str]:
    """The tokenizer and engine step names of the ensemble ``name`` of ``kind``.

    ``NAME_tokenizer`` and ``NAME_embedder`` (an embedding model), ``NAME_scorer`` (a
    reranker), ``NAME_sparse_encoder`` (a sparse model) or ``NAME_token_encoder`` (a
    multi-vector model, :data:`ENGINE_STEPS`); the shipped
    ``embed`` keeps ``tokenizer`` and ``embedder``. ``triton-embed repository add`` names
    them so.
    """
    if name == LEGACY_NAME and kind == "embedding":
        return STEPS
    return f"{name}_tokenizer", f"{name}_{ENGINE_STEPS[kind]}"


def _failed(action: str, name: str, exc: BaseException, url: str) -> EmbedClientError:
    """The client error for a refused or failed call, its message on one line.

    Triton's load errors can span lines (a Python traceback of the model's ``initialize``).
    """
    error = map_error(exc, url)
    message = " ".join(str(error).split())
    where = "" if url in message else f" at {url}"
    return type(error)(f"cannot {action} model {name!r}{where}: {message}")


def load_model(
    grpc_client: Any, name: str, *, url: str, headers: dict[str, str] | None, timeout_s: float
) -> None:
    """Load (or reload) ``name`` and wait until the server says it is ready.

    Args:
        grpc_client: a ``tritonclient.grpc.InferenceServerClient``.
        name: the model (an ensemble loads its steps too).
        url: the server's ``host:port`` (for messages).
        headers: the gRPC metadata carrying the admin key, or ``None``.
        timeout_s: deadline of the load call, and then of the wait for readiness.

    Raises:
        AccessDeniedError: the server refused the call (no admin key, or a wrong one).
        EmbedTimeoutError: the model was not ready within ``timeout_s``.
        EmbedClientError: the server could not load it (an unknown model, a failing
            ``initialize``: Triton's message), or could not be reached.
    """
    candidates = {step for kind in ENGINE_STEPS for step in step_names(name, kind)}
    before = {m: _ready(grpc_client, m) for m in sorted(candidates)}
    try:
        grpc_client.load_model(name, headers=headers, client_timeout=timeout_s)
    except Exception as exc:  # tritonclient / grpc errors
        error = _failed("load", name, exc, url)
        # A step that loaded for this failed ensemble holds its memory (an embedder or a
        # scorer holds a vLLM engine) and serves nothing: unload it.
        for step, was_ready in before.items():
            if not was_ready and _ready(grpc_client, step):
                try:
                    grpc_client.unload_model(step, headers=headers, client_timeout=timeout_s)
                except Exception:  # the load's error is the one to report
                    pass
        raise error from None
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if grpc_client.is_model_ready(name):
                return
        except Exception as exc:
            raise _failed("load", name, exc, url) from None
        if time.monotonic() >= deadline:
            raise EmbedTimeoutError(
                f"model {name!r} at {url} was loaded but is not ready after {timeout_s:g} s"
            )
        time.sleep(READY_POLL_S)


def unload_model(
    grpc_client: Any, name: str, *, url: str, headers: dict[str, str] | None, timeout_s: float
) -> None:
    """Unload ``name``, and the steps of an ensemble that no other loaded model uses.

    ``unload_dependents`` only unloads the steps the ensemble's load brought in; a step that
    was loaded on its own since (the supervisor reloads a step whose stub died) stays. So
    the steps are also unloaded by name, unless another READY ensemble uses them.

    Raises:
        AccessDeniedError: the server refused the call (no admin key, or a wrong one).
        EmbedClientError: any other failure (Triton's message on one line).
    """
    try:
        steps = _steps(grpc_client, name, headers)
        if _ready(grpc_client, name):
            grpc_client.unload_model(
                name, headers=headers, unload_dependents=True, client_timeout=timeout_s
            )
        ready = {
            m["name"]
            for m in grpc_client.get_model_repository_index(headers=headers, as_json=True).get(
                "models", []
            )
            if m.get("state") == "READY" and m["name"] != name
        }
        used = {step for other in ready for step in _steps(grpc_client, other, headers)}
        for step in steps:
            if step in ready and step not in used:
                grpc_client.unload_model(step, headers=headers, client_timeout=timeout_s)
        # The unload call returns while the models are still UNLOADING: wait until they are
        # gone, so "unloaded" means their stubs and memory are released.
        deadline = time.monotonic() + timeout_s
        while any(_ready(grpc_client, m) for m in (name, *steps)):
            if time.monotonic() >= deadline:
                raise EmbedTimeoutError(
                    f"model {name!r} at {url} is still loaded {timeout_s:g} s after the unload"
                )
            time.sleep(READY_POLL_S)
    except EmbedClientError:
        raise
    except Exception as exc:  # tritonclient / grpc errors
        raise _failed("unload", name, exc, url) from None


def _ready(grpc_client: Any, name: str) -> bool:
    try:
        return bool(grpc_client.is_model_ready(name))
    except Exception:  # an unknown model: not ready
        return False


def _steps(grpc_client: Any, name: str, headers: dict[str, str] | None) -> list[str]:
    """The step models of ensemble ``name``: from its live config, else by the naming rule.

    A model that is not loaded has no live config; :func:`step_names` then names what
    ``repository add`` would have written, for either kind. A model that is not an ensemble
    has no steps.
    """
    try:
        config = grpc_client.get_model_config(name, headers=headers, as_json=True)["config"]
    except Exception:  # not loaded (or unknown): the naming rule
        return sorted({step for kind in ENGINE_STEPS for step in step_names(name, kind)})
    return [s["model_name"] for s in config.get("ensemble_scheduling", {}).get("step", [])]


class ModelControl(ChannelOwner):
    """Load and unload models of a running server.

    Args:
        url: the server's gRPC ``host:port``.
        admin_key: the admin key; ``None`` reads it as
            :func:`triton_embed.admin.read_admin_key` does (``TRITON_EMBED_ADMIN_KEY``, the
            file ``TRITON_EMBED_ADMIN_KEY_FILE``, the default key file), if any.
        timeout_s: deadline of each call, seconds (a load waits this long for readiness).

    Raises:
        InvalidInputError: a ``url`` with a scheme, an unusable key, ``timeout_s`` <= 0.
        EmbedClientError: the configured key file cannot be read.
    """

    def __init__(
        self, url: str = DEFAULT_URL, admin_key: str | None = None, timeout_s: float = 600.0
    ):
        import tritonclient.grpc as grpcclient

        check_url(url)
        if not timeout_s > 0:
            raise InvalidInputError(f"timeout_s must be > 0, got {timeout_s!r}")
        key = admin_key_of(admin_key)
        self.url = url
        self.timeout_s = timeout_s
        self._headers = grpc_headers(key) or None
        self._client = grpcclient.InferenceServerClient(url)

    @classmethod
    def over(
        cls, grpc_client: Any, *, url: str, headers: dict[str, str] | None, timeout_s: float
    ) -> ModelControl:
        """A ``ModelControl`` over a client someone else owns (an ``EmbeddingClient``'s).

        Args:
            grpc_client: a ``tritonclient.grpc.InferenceServerClient``.
            url: its ``host:port`` (for messages).
            headers: the gRPC metadata carrying the admin key, or ``None``.
            timeout_s: deadline of each call, seconds.
        """
        control = cls.__new__(cls)
        control.url = url
        control.timeout_s = timeout_s
        control._headers = headers
        control._client = grpc_client
        return control

    def load_model(self, name: str) -> None:
        """Load (or reload) ``name`` and wait until it is ready (see :func:`load_model`)."""
        load_model(
            self._client, name, url=self.url, headers=self._headers, timeout_s=self.timeout_s
        )

    def unload_model(self, name: str) -> None:
        """Unload ``name`` and its steps (see :func:`unload_model`)."""
        unload_model(
            self._client, name, url=self.url, headers=self._headers, timeout_s=self.timeout_s
        )
