"""The gateway's settings: parsed once from the command line, validated, passed as one object.

The flags are defined once, in :func:`~triton_embed_server.gateway.command.add_gateway_args`
(``triton-embed gateway`` and ``python -m triton_embed_server.gateway`` share them). Keys
are not settings: the settings name the files (``--api-key-file``, ``--admin-key-file``)
and each process reads them (:meth:`GatewaySettings.api_key`, :meth:`~GatewaySettings.admin_key`),
so the settings can travel to ``--workers`` processes as JSON without a secret in them.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from triton_embed.admin import read_admin_key, read_key_file
from triton_embed.client import DEFAULT_MODEL
from triton_embed.transport.addresses import Target, parse_upstreams
from triton_embed.transport.inference import MAX_INPUTS

from triton_embed_server.gateway.auth import load_api_key
from triton_embed_server.gateway.protocol import DEFAULT_HEADER_TIMEOUT_S
from triton_embed_server.gateway.tenancy import TenantRegistry
from triton_embed_server.run.trace_args import otlp_traces_url
from triton_embed_server.steps.config import CHARS_PER_TOKEN_CAP

if TYPE_CHECKING:
    from triton_embed_server.gateway.shared import SharedStore

#: The shipped model's token budget per text (``model_repository/embed``: ``max_length``).
SHIPPED_MAX_LENGTH = 256
#: JSON bytes around one input string: its quotes, a comma, a space or newline and indent.
JSON_BYTES_PER_INPUT = 6
#: JSON bytes of a request's other fields (model, options), generously.
JSON_BYTES_OTHER = 64 * 1024
#: The default body limit: the largest request whose every character reaches the tokenizer
#: step, in single-byte characters: 2,048 inputs x the tokenizer's default character cap
#: (64 per token x 256 tokens = 16,384) + JSON = 33,632,256 bytes (32.07 MiB). A longer text
#: is cut at the cap by the step anyway; a multi-byte script fills the cap in fewer texts.
DEFAULT_MAX_BODY_BYTES = (
    MAX_INPUTS * (CHARS_PER_TOKEN_CAP * SHIPPED_MAX_LENGTH + JSON_BYTES_PER_INPUT)
    + JSON_BYTES_OTHER
)
#: Calls in flight to one model on one upstream (``--max-upstream-calls``): under the
#: shipped steps' ``max_queue_size`` (70), with room for the server's other clients; 32
#: pieces of 16 pairs keep two scorer replicas busy (docs/rerank.md, "Throughput").
DEFAULT_MAX_UPSTREAM_CALLS = 32
#: The default token budget of one embedding request (``--max-request-tokens``): 2**17 =
#: 131,072 tokens, 512 texts at the shipped model's full 256-token budget. The CPU engine
#: embeds about 5,000-14,000 tokens/s on 2 cores, so a request at the budget takes 9-26 s:
#: well inside the 60 s upstream deadline (``--timeout-s``), where OpenAI's 300,000 would
#: take 21-60 s. (The largest request the other limits allow, 2,048 x 256 = 524,288 tokens,
#: would take 37-105 s.)
DEFAULT_MAX_REQUEST_TOKENS = 2**17
#: Requests doing upstream work at once (``--max-upstream-requests``); more wait in the
#: gateway's scheduler, in class and fair-share order. 64: the most the benchmarks keep in
#: flight (perf/README.md, 1 text/request x 64), so one class alone never waits here.
DEFAULT_MAX_UPSTREAM_REQUESTS = 64
#: Seconds a request's body may take beyond its size's share (``--body-timeout-s``).
DEFAULT_BODY_TIMEOUT_S = 20.0


#: The settings fields no flag sets: the command fills them in (``--workers N``).
NOT_FLAGS = frozenset({"shared_dir"})


def configure_logging(level: str) -> None:
    """The gateway's log lines on stderr: time, level, ``[gateway]``, message.

    Args:
        level: a :mod:`logging` level name, any case (``info``, ``DEBUG``, ...).
    """
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s [gateway] %(message)s"
    )


@dataclass(frozen=True)
class GatewaySettings:
    """How one gateway runs.

    Attributes:
        upstreams: ``HOST:PORT`` gRPC addresses of the Triton servers (host names are
            resolved to all their addresses, again every few seconds).
        host: the address to listen on.
        port: the port to listen on.
        api_key_file: file holding the key clients must send (``None``: the environment
            variable ``TRITON_EMBED_GATEWAY_API_KEY``, else no key); one tenant.
        tenants_file: the tenants file (YAML, :mod:`~triton_embed_server.gateway.tenants`);
            it replaces ``api_key_file``.
        admin_key_file: file holding the servers' admin key (``None``: where
            :func:`triton_embed.admin.read_admin_key` looks).
        max_body_mb: the largest request body, MiB (``None``: :data:`DEFAULT_MAX_BODY_BYTES`).
        max_request_tokens: tokens one embedding request may hold in all
            (:data:`DEFAULT_MAX_REQUEST_TOKENS`).
        header_timeout_s: seconds a request's headers may take
            (:mod:`~triton_embed_server.gateway.protocol`).
        body_timeout_s: seconds its body may take, plus 1 s per 64 KiB
            (:func:`~triton_embed_server.gateway.body.read_body`).
        max_in_flight: requests handled at once; more are answered 429.
        merge_in_flight: upstream calls per model and request parameters before further
            small text requests wait and are merged into one call (0: no merging;
            :mod:`~triton_embed_server.gateway.merging`).
        max_upstream_requests: requests doing upstream work at once; more wait in the
            gateway's scheduler (:mod:`~triton_embed_server.gateway.fair`: interactive
            first, fair shares by tokens within a class).
        max_upstream_calls: calls in flight to one model on one upstream; a request's
            further pieces wait in the gateway for a free one
            (:class:`~triton_embed.transport.upstreams.UpstreamPool`, ``calls_per_model``).
        default_model: the model of the TEI routes.
        default_reranker: the reranker of TEI's ``/rerank`` and of a rerank or score request
            without ``model`` (``None``: the only reranker the upstreams serve).
        timeout_s: deadline of a request's upstream work, seconds: its pieces still running
            then are cancelled and the request is answered 504.
        workers: uvicorn worker processes.
        shared_dir: the private folder the ``--workers N`` processes share (their limits,
            usage and metrics, :mod:`~triton_embed_server.gateway.shared`); set by
            :func:`~triton_embed_server.gateway.command.run`, not a flag; ``None``: one worker.
        log_level: ``critical``, ``error``, ``warning``, ``info`` or ``debug``.
        otlp_endpoint: the OTLP/HTTP URL the request spans are exported to
            (:mod:`~triton_embed_server.gateway.tracing`); ``None``: no tracing at all.
    """

    upstreams: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 8080
    api_key_file: str | None = None
    tenants_file: str | None = None
    admin_key_file: str | None = None
    max_body_mb: float | None = None
    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_in_flight: int = 512
    merge_in_flight: int = 0
    max_upstream_calls: int = DEFAULT_MAX_UPSTREAM_CALLS
    max_upstream_requests: int = DEFAULT_MAX_UPSTREAM_REQUESTS
    default_model: str = DEFAULT_MODEL
    default_reranker: str | None = None
    timeout_s: float = 60.0
    workers: int = 1
    log_level: str = "info"
    otlp_endpoint: str | None = None
    shared_dir: str | None = None

    def __post_init__(self) -> None:
        parse_upstreams(self.upstreams)  # raises ValueError naming a bad entry
        positive = {
            "max_body_mb": 1 if self.max_body_mb is None else self.max_body_mb,
            "max_request_tokens": self.max_request_tokens,
            "header_timeout_s": self.header_timeout_s,
            "body_timeout_s": self.body_timeout_s,
            "max_in_flight": self.max_in_flight,
            "max_upstream_calls": self.max_upstream_calls,
            "max_upstream_requests": self.max_upstream_requests,
            "timeout_s": self.timeout_s,
        }
        bad = [f"{name}={value}" for name, value in positive.items() if not value > 0]
        if bad:
            raise ValueError(f"{', '.join(bad)}: each must be > 0")
        if self.api_key_file is not None and self.tenants_file is not None:
            raise ValueError(
                "give --tenants or --api-key-file, not both: the tenants file holds every key "
                "(add the key's digest to a tenant there)"
            )
        if self.otlp_endpoint is not None:
            otlp_traces_url(self.otlp_endpoint)  # raises ValueError naming a bad URL
        if self.merge_in_flight < 0:
            raise ValueError(
                f"merge_in_flight must be >= 0 (0: no merging), got {self.merge_in_flight}"
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GatewaySettings:
        """The settings of parsed ``add_gateway_args`` flags."""
        return cls(
            upstreams=tuple(args.upstream),
            host=args.host,
            port=args.port,
            api_key_file=None if args.api_key_file is None else str(args.api_key_file),
            tenants_file=None if args.tenants_file is None else str(args.tenants_file),
            admin_key_file=None if args.admin_key_file is None else str(args.admin_key_file),
            max_body_mb=args.max_body_mb,
            max_request_tokens=args.max_request_tokens,
            header_timeout_s=args.header_timeout_s,
            body_timeout_s=args.body_timeout_s,
            max_in_flight=args.max_in_flight,
            merge_in_flight=args.merge_in_flight,
            max_upstream_calls=args.max_upstream_calls,
            max_upstream_requests=args.max_upstream_requests,
            default_model=args.default_model,
            default_reranker=args.default_reranker,
            timeout_s=args.timeout_s,
            workers=args.workers,
            log_level=args.log_level,
            otlp_endpoint=args.otlp_endpoint,
        )

    def to_json(self) -> str:
        """The settings as JSON (no keys in it)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> GatewaySettings:
        """Settings written by :meth:`to_json`."""
        data = json.loads(text)
        data["upstreams"] = tuple(data["upstreams"])
        return cls(**data)

    @property
    def targets(self) -> list[Target]:
        """The upstream entries, parsed."""
        return parse_upstreams(self.upstreams)

    @property
    def max_body_bytes(self) -> int:
        """:attr:`max_body_mb` in bytes (:data:`DEFAULT_MAX_BODY_BYTES` when not set)."""
        if self.max_body_mb is None:
            return DEFAULT_MAX_BODY_BYTES
        return int(self.max_body_mb * 2**20)

    def api_key(self) -> str | None:
        """The key clients must send, or ``None`` (:func:`~.auth.load_api_key`).

        Raises:
            OSError, ValueError: the file cannot be read or holds no usable key.
        """
        return load_api_key(None if self.api_key_file is None else Path(self.api_key_file))

    def tenant_registry(self, store: SharedStore | None = None) -> TenantRegistry:
        """The tenants: of :attr:`tenants_file`, else of the API key, else an open gateway.

        Args:
            store: the workers' shared store (``--workers N``), where the buckets live.

        Raises:
            OSError, ValueError: a file cannot be read or is not valid (a tenants file's
                error names its line, field and reason).
        """
        if self.tenants_file is not None:
            return TenantRegistry.from_sources(Path(self.tenants_file), None, store)
        return TenantRegistry.from_sources(None, self.api_key(), store)

    def admin_key(self) -> str | None:
        """The servers' admin key, or ``None`` when none is configured.

        Raises:
            OSError, ValueError: the file cannot be read or holds no usable key.
        """
        if self.admin_key_file is not None:
            return read_key_file(Path(self.admin_key_file))
        return read_admin_key()
