"""Tenants: the file that names them (``--tenants FILE``), its validation, and key lookup.

A tenant is who sent a request: its API keys select it. The file is YAML (docs/tenants.md)::

    usd_per_million_tokens: 0.004        # optional: the cost of a token, for usage reports
    tenants:
      - name: search                     # [a-z0-9_-], at most 64 characters; a metric label
        keys_sha256: [<64 hex digits>]   # printf %s KEY | sha256sum: no secret in the file
        priority: interactive            # interactive (level 1) or batch (level 2)
        models: [embed]                  # optional: names or aliases it may use (default all)
        tokens_per_minute: 600000        # optional token rate ...
        burst: 100000                    # ... and bucket size (default: tokens_per_minute)
        max_concurrency: 16              # optional: its requests at the upstreams at once
        weight: 1                        # optional: its fair share within its class

It is validated by a pydantic model (:class:`TenantsFile`), and every error names the line
of the YAML node at fault, the field and the reason (:class:`TenantsFileError`). A key is
matched by its SHA-256 digest, compared with :func:`hmac.compare_digest` against every
digest of every tenant (no early exit), so the time does not depend on which digest or
which byte differs. Keys are never logged; only tenant names are.

``--api-key-file`` (or ``TRITON_EMBED_GATEWAY_API_KEY``) is one tenant, :data:`KEY_TENANT`,
of class interactive with no limits; neither flag: the gateway is open and every request
is :data:`OPEN_TENANT`'s.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from triton_embed.priority import Priority

#: The tenant of ``--api-key-file``'s key.
KEY_TENANT = "default"
#: The tenant of every request of an open gateway (no key configured).
OPEN_TENANT = "open"
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
DIGEST_PATTERN = re.compile(r"^[0-9a-f]{64}$")


class TenantEntry(BaseModel):
    """One tenant of the file (the YAML mapping under ``tenants``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    keys_sha256: list[str] = Field(min_length=1)
    priority: Priority
    models: list[str] | None = None
    tokens_per_minute: int | None = Field(default=None, gt=0)
    burst: int | None = Field(default=None, gt=0)
    max_concurrency: int | None = Field(default=None, gt=0)
    weight: float = Field(default=1.0, gt=0, le=1000)

    @field_validator("keys_sha256")
    @classmethod
    def _digests(cls, value: list[str]) -> list[str]:
        out = []
        for i, digest in enumerate(value):
            digest = digest.strip().lower()
            if not DIGEST_PATTERN.match(digest):
                raise ValueError(
                    f"item {i} is not a SHA-256 hex digest (64 hex digits); make one with: "
                    "printf %s KEY | sha256sum"
                )
            out.append(digest)
        return out

    @field_validator("models")
    @classmethod
    def _models(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not all(isinstance(m, str) and m for m in value)):
            raise ValueError("must list at least one model name (leave it out for all models)")
        return value

    @model_validator(mode="after")
    def _burst_needs_rate(self) -> TenantEntry:
        if self.burst is not None and self.tokens_per_minute is None:
            raise ValueError("burst needs tokens_per_minute (the rate that refills it)")
        return self


class TenantsFile(BaseModel):
    """The whole file: the tenants, and the cost of a token."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenants: list[TenantEntry] = Field(min_length=1)
    usd_per_million_tokens: float = Field(default=0.0, ge=0)


class TenantsFileError(ValueError):
    """The tenants file cannot be used; the message names the file, line, field and reason."""


@dataclass(frozen=True)
class Tenant:
    """A tenant as the gateway uses it.

    Attributes:
        name: its name (the ``tenant`` label of the metrics).
        priority: its class (the Triton priority level of its requests).
        models: the model names and aliases it may use; ``None``: all.
        tokens_per_minute: its token rate; ``None``: no limit.
        burst: its bucket's size in tokens (``tokens_per_minute`` when not given).
        max_concurrency: its requests at the upstreams at once; ``None``: no cap.
        weight: its fair share within its class (by tokens).
    """

    name: str
    priority: Priority = Priority.INTERACTIVE
    models: frozenset[str] | None = None
    tokens_per_minute: int | None = None
    burst: int | None = None
    max_concurrency: int | None = None
    weight: float = 1.0


@dataclass(frozen=True)
class Tenants:
    """The tenants in force and their key digests.

    Attributes:
        tenants: by name.
        digests: ``(SHA-256 digest bytes, tenant name)`` of every key.
        usd_per_million_tokens: the cost of a token (0: not known).
        open: no key is required: every request is :data:`OPEN_TENANT`'s.
    """

    tenants: dict[str, Tenant]
    digests: tuple[tuple[bytes, str], ...]
    usd_per_million_tokens: float = 0.0
    open: bool = False

    def identify(self, key: str | None) -> Tenant | None:
        """The tenant of ``key``, or ``None`` (no key, or a key of no tenant).

        Every digest is compared (:func:`hmac.compare_digest`), with no early exit.
        """
        if self.open:
            return self.tenants[OPEN_TENANT]
        if not key:
            return None
        given = hashlib.sha256(key.encode("utf-8")).digest()
        found = None
        for digest, name in self.digests:
            if hmac.compare_digest(given, digest) and found is None:
                found = name
        return None if found is None else self.tenants[found]


def open_tenants() -> Tenants:
    """An open gateway: one tenant, :data:`OPEN_TENANT`, no key."""
    return Tenants({OPEN_TENANT: Tenant(OPEN_TENANT)}, (), open=True)


def key_tenants(key: str) -> Tenants:
    """``--api-key-file``'s one key as one tenant, :data:`KEY_TENANT` (interactive, no limits)."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return Tenants({KEY_TENANT: Tenant(KEY_TENANT)}, ((digest, KEY_TENANT),))


def _node_at(node: yaml.Node | None, loc: Sequence[Any]) -> yaml.Node | None:
    """The YAML node at pydantic's error location ``loc`` (as deep as it exists)."""
    for part in loc:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            match = [(k, v) for k, v in node.value if getattr(k, "value", None) == part]
            if not match:
                return node
            node = match[0][1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return node
            node = node.value[part]
        else:
            return node
    return node


def _where(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the file"


def _check_unique(parsed: TenantsFile, root: yaml.Node | None, source: str) -> None:
    """Refuse a tenant name, or a key digest, given twice (names the later one's line).

    Raises:
        TenantsFileError: a duplicate.
    """
    names: dict[str, int] = {}
    owner: dict[str, str] = {}
    for i, tenant in enumerate(parsed.tenants):
        node = _node_at(root, ("tenants", i, "name"))
        line = f", line {node.start_mark.line + 1}" if node is not None else ""
        if tenant.name in names:
            raise TenantsFileError(
                f"{source}{line}, tenants[{i}].name: {tenant.name!r} is also the name of "
                f"tenants[{names[tenant.name]}]; names are unique"
            )
        names[tenant.name] = i
        for j, digest in enumerate(tenant.keys_sha256):
            if digest in owner:
                node = _node_at(root, ("tenants", i, "keys_sha256", j))
                line = f", line {node.start_mark.line + 1}" if node is not None else ""
                raise TenantsFileError(
                    f"{source}{line}, tenants[{i}].keys_sha256[{j}]: the digest is also a "
                    f"key of tenant {owner[digest]!r}; one key selects one tenant"
                )
            owner[digest] = tenant.name


def _check_no_repeated_fields(root: yaml.Node | None, source: str) -> None:
    """Refuse a mapping that states a field twice (YAML keeps the last one silently).

    Raises:
        TenantsFileError: names the repeated field and its second line.
    """
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        raise TenantsFileError(
                            f"{source}, line {key.start_mark.line + 1}: the field "
                            f"{key.value!r} is given twice in one mapping; keep one"
                        )
                    seen.add(key.value)
                stack.append(value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def parse_tenants(text: str, source: str = "the tenants file") -> Tenants:
    """The tenants of a file's text.

    Raises:
        TenantsFileError: not YAML, or not a valid tenants file; the message names
            ``source``, the line, the field and the reason (e.g. ``tenants.yaml, line 7,
            tenants[1].priority: Input should be 'interactive' or 'batch'``).
    """
    try:
        # BaseLoader: every scalar is read as its text (a digest of digits stays a string;
        # no YAML 1.1 surprises such as "no" for false), and pydantic converts numbers.
        root = yaml.compose(text, Loader=yaml.BaseLoader)
        data = yaml.load(text, Loader=yaml.BaseLoader)  # noqa: S506 - BaseLoader builds no objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f", line {mark.line + 1}" if mark is not None else ""
        reason = getattr(exc, "problem", None) or str(exc)
        raise TenantsFileError(f"{source}{line}: not valid YAML: {reason}") from None
    if data is None or data == "":
        raise TenantsFileError(f"{source}: the file is empty; it needs a 'tenants' list")
    _check_no_repeated_fields(root, source)
    try:
        parsed = TenantsFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(first["loc"])
        node = _node_at(root, loc)
        line = f", line {node.start_mark.line + 1}" if node is not None else ""
        reason = first["msg"].removeprefix("Value error, ")
        more = len(exc.errors()) - 1
        extra = f" (and {more} more error{'s' if more > 1 else ''})" if more else ""
        raise TenantsFileError(f"{source}{line}, {_where(loc)}: {reason}{extra}") from None
    _check_unique(parsed, root, source)
    tenants = {
        t.name: Tenant(
            name=t.name,
            priority=t.priority,
            models=None if t.models is None else frozenset(t.models),
            tokens_per_minute=t.tokens_per_minute,
            burst=t.burst if t.burst is not None else t.tokens_per_minute,
            max_concurrency=t.max_concurrency,
            weight=t.weight,
        )
        for t in parsed.tenants
    }
    digests = tuple(
        (bytes.fromhex(d), t.name) for t in parsed.tenants for d in t.keys_sha256
    )  # fmt: skip
    return Tenants(tenants, digests, parsed.usd_per_million_tokens)


def load_tenants(path: Path) -> Tenants:
    """The tenants of the file at ``path``.

    Raises:
        TenantsFileError: it cannot be read, or is not a valid tenants file (names the
            file, the line, the field and the reason).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TenantsFileError(f"{path}: cannot be read: {exc}") from None
    return parse_tenants(text, str(path))
