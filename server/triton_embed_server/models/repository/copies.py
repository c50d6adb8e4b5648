"""Copies of a Triton model repository with fields of their ``config.pbtxt`` files changed.

The tests, the benchmark and the GPU sweep serve variants of ``model_repository`` (fewer
embedder instances, another model folder, another batching delay, GPU instances). They copy
the repository with :func:`copy_repository` and change the copy's configs with
:func:`edit_config`, never the shipped files.

A ``config.pbtxt`` is a ``ModelConfig`` message in protobuf text format
(https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/model_configuration.html).
The editor works on the text, so comments and layout survive: it blanks comments and the
contents of quoted strings, finds the field in what remains, and replaces only that value.
A field that is not there, or is there more than once where one is expected, raises
:class:`ValueError` naming the field; an edit never silently does nothing.

    repo = copy_repository(tmp / "model_repository")
    edit_config(
        repo / "embedder" / "config.pbtxt",
        count=1,
        max_queue_delay_us=0,
        max_queue_size=4,
        queue_timeout_us=2_000_000,
        parameters={"model_path": "/models/my-model"},
    )
"""

from __future__ import annotations

import compileall
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from triton_embed.priority import BATCH_TIMEOUT_FACTOR

MODEL_REPOSITORY = Path(__file__).resolve().parents[4] / "model_repository"

# ModelInstanceGroup.Kind of Triton's model_config.proto; tritonclient ships the message:
#   python -c "from tritonclient.grpc import model_config_pb2 as m
#   print(m.ModelInstanceGroup.Kind.keys())"
INSTANCE_KINDS = ("KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL")


def copy_repository(
    dest: Path, source: Path = MODEL_REPOSITORY, models: Iterable[str] | None = None
) -> Path:
    """Copy a model repository (without ``__pycache__`` folders) to a new folder.

    Args:
        dest: folder to create; it must not exist yet.
        source: repository to copy (default: this project's ``model_repository``).
        models: copy only these model folders of ``source`` (default: all of ``source``).

    Returns:
        ``dest``.

    Raises:
        FileExistsError: ``dest`` exists.
        ValueError: a name in ``models`` is not a folder of ``source`` holding a
            ``config.pbtxt``.
    """
    dest, source = Path(dest), Path(source)
    if dest.exists():
        raise FileExistsError(f"{dest} exists; copy_repository makes a new folder")
    ignore = shutil.ignore_patterns("__pycache__")
    if models is None:
        shutil.copytree(source, dest, ignore=ignore)
        return precompile(dest)
    names = list(models)
    missing = [m for m in names if not (source / m / "config.pbtxt").is_file()]
    if missing:
        raise ValueError(f"{source}: no model folder with a config.pbtxt named {missing}")
    dest.mkdir(parents=True)
    for name in names:
        shutil.copytree(source / name, dest / name, ignore=ignore)
    return precompile(dest)


def precompile(repository: Path) -> Path:
    """Write the ``__pycache__`` of every ``model.py`` in ``repository`` now, before a server.

    The Python-backend stub's embedded interpreter writes ``<model>/1/__pycache__`` when it
    first imports ``model.py`` (it ignores ``PYTHONDONTWRITEBYTECODE``); Triton 2.51 then sees
    the model's folder as modified, and the next load of the ensemble reloads its steps too.
    With the bytecode already there and up to date, the stub writes nothing.

    Returns:
        ``repository``.
    """
    compileall.compile_dir(str(repository), quiet=1)
    return repository


def edit_config(path: Path, **fields: Any) -> str:
    """Change fields of one ``config.pbtxt`` in place; the other lines stay as they are.

    Args:
        path: the config file (``<model>/config.pbtxt`` or ``<model>/configs/<name>.pbtxt``).
        **fields: the fields to change: the keywords of :func:`edit_text`.

    Returns:
        The new text of the file.

    Raises:
        ValueError: a field to change is not in the file (or is ambiguous), or a value is out
            of range; the message names the file. The file is then left unchanged.
    """
    path = Path(path)
    try:
        text = edit_text(path.read_text(), **fields)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    path.write_text(text)
    return text


def edit_text(
    text: str,
    *,
    name: str | None = None,
    step_models: Iterable[str] | None = None,
    count: int | None = None,
    kind: str | None = None,
    max_queue_delay_us: int | None = None,
    max_queue_size: int | None = None,
    queue_timeout_us: int | None = None,
    parameters: Mapping[str, str] | None = None,
) -> str:
    """``text`` of a ``config.pbtxt`` with fields changed (see :func:`edit_config`).

    Args:
        text: the config's text.
        name: the model's top-level ``name``.
        step_models: the ``model_name`` of each ``ensemble_scheduling`` step, in order.
        count: the ``count`` of the model's one ``instance_group`` entry.
        kind: the ``kind`` of that entry (one of :data:`INSTANCE_KINDS`).
        max_queue_delay_us: ``dynamic_batching { max_queue_delay_microseconds }``.
        max_queue_size: ``dynamic_batching { default_queue_policy { max_queue_size } }``:
            requests a step holds waiting; past it, a request is refused at once.
        queue_timeout_us: ``dynamic_batching { default_queue_policy
            { default_timeout_microseconds } }``: the longest wait in the queue.
        parameters: ``parameters`` entries to set, ``{key: string_value}``; each key must
            already be in the file.

    Raises:
        ValueError: a field to change is not in the text (or is ambiguous), or a value is
            out of range.
    """
    if name is not None:
        text = set_name(text, name)
    if step_models is not None:
        text = set_step_models(text, list(step_models))
    if count is not None or kind is not None:
        text = set_instance_group(text, count=count, kind=kind)
    if max_queue_delay_us is not None:
        text = set_max_queue_delay(text, max_queue_delay_us)
    if max_queue_size is not None or queue_timeout_us is not None:
        text = set_queue_policy(text, max_queue_size=max_queue_size, timeout_us=queue_timeout_us)
    for key, value in (parameters or {}).items():
        text = set_parameter(text, key, value)
    return text


def set_name(text: str, name: str) -> str:
    """``text`` with the model's top-level ``name`` replaced.

    Raises:
        ValueError: no top-level ``name`` line, or more than one.
    """
    found = list(re.finditer(r'^name\s*:\s*"(x*)"', _mask(text), re.M))
    if len(found) != 1:
        raise ValueError(f"expected one top-level name field, found {len(found)}")
    return _apply(text, [(found[0].start(1), found[0].end(1), _escape(name))])


def set_step_models(text: str, names: list[str]) -> str:
    """``text`` with the ``model_name`` of each ensemble step replaced, in order.

    Raises:
        ValueError: the ``ensemble_scheduling`` block has another number of steps.
    """
    masked = _mask(text)
    start, end = _single_block(masked, "ensemble_scheduling")
    found = list(re.finditer(r'\bmodel_name\s*:\s*"(x*)"', masked[start:end]))
    if len(found) != len(names):
        raise ValueError(f"expected {len(names)} ensemble steps, found {len(found)}")
    pairs = zip(found, names, strict=True)
    edits = [(start + m.start(1), start + m.end(1), _escape(n)) for m, n in pairs]
    return _apply(text, edits)


def set_instance_group(text: str, count: int | None = None, kind: str | None = None) -> str:
    """``text`` with the ``count`` and/or ``kind`` of its one ``instance_group`` entry replaced.

    Raises:
        ValueError: no ``instance_group``, more than one entry, the entry lacks the field,
            ``count`` < 1, or ``kind`` is not one of :data:`INSTANCE_KINDS`.
    """
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError(f"instance_group count must be an integer >= 1, got {count!r}")
    if kind is not None and kind not in INSTANCE_KINDS:
        raise ValueError(f"instance_group kind must be one of {INSTANCE_KINDS}, got {kind!r}")
    masked = _mask(text)
    start, end = _single_block(masked, "instance_group")
    edits = []
    for field, value, pattern in (
        ("count", count, r"-?\d+"),
        ("kind", kind, r"[A-Z_]+"),
    ):
        if value is None:
            continue
        found = list(re.finditer(rf"\b{field}\s*:\s*({pattern})", masked[start:end]))
        if len(found) != 1:
            raise ValueError(
                f"expected one instance_group entry with a {field} field, found {len(found)}"
            )
        edits.append((start + found[0].start(1), start + found[0].end(1), str(value)))
    return _apply(text, edits)


def set_max_queue_delay(text: str, microseconds: int) -> str:
    """``text`` with ``dynamic_batching { max_queue_delay_microseconds }`` replaced.

    Raises:
        ValueError: no ``dynamic_batching`` block, the block lacks the field, or
            ``microseconds`` < 0.
    """
    if isinstance(microseconds, bool) or not isinstance(microseconds, int) or microseconds < 0:
        raise ValueError(
            f"max_queue_delay_microseconds must be an integer >= 0, got {microseconds!r}"
        )
    masked = _mask(text)
    start, end = _single_block(masked, "dynamic_batching")
    found = list(re.finditer(r"\bmax_queue_delay_microseconds\s*:\s*(\d+)", masked[start:end]))
    if len(found) != 1:
        raise ValueError(
            f"expected one dynamic_batching max_queue_delay_microseconds, found {len(found)}"
        )
    return _apply(text, [(start + found[0].start(1), start + found[0].end(1), str(microseconds))])


def set_queue_policy(
    text: str, max_queue_size: int | None = None, timeout_us: int | None = None
) -> str:
    """``text`` with the queue bound and timeout of every priority level replaced.

    The interactive level's are ``dynamic_batching { default_queue_policy { ... } }``; a
    ``priority_queue_policy`` (the batch level, :mod:`triton_embed.priority`) gets the same
    bound and :data:`~triton_embed.priority.BATCH_TIMEOUT_FACTOR` times the timeout, as the
    shipped configs state them.

    Args:
        text: a ``config.pbtxt``.
        max_queue_size: the new ``max_queue_size`` (requests; 0 = unbounded).
        timeout_us: the new ``default_timeout_microseconds`` (0 = no timeout).

    Raises:
        ValueError: no ``dynamic_batching`` block, none or several ``default_queue_policy``
            blocks in it, a policy lacks the field, or a value is not an integer >= 0.
    """
    fields = (
        ("max_queue_size", max_queue_size, 1),
        ("default_timeout_microseconds", timeout_us, BATCH_TIMEOUT_FACTOR),
    )
    for name, value, _ in fields:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    masked = _mask(text)
    outer, outer_end = _single_block(masked, "dynamic_batching")
    policies = [(*_single_block(masked, "default_queue_policy", outer, outer_end), False)]
    for m in re.finditer(r"\bpriority_queue_policy\s*\{", masked[outer:outer_end]):
        at = outer + m.start()
        policies.append((*_single_block(masked, "priority_queue_policy", at, outer_end), True))
    edits = []
    for start, end, other_level in policies:
        for name, value, factor in fields:
            if value is None:
                continue
            found = list(re.finditer(rf"\b{name}\s*:\s*(\d+)", masked[start:end]))
            if len(found) != 1:
                block = "priority_queue_policy" if other_level else "default_queue_policy"
                raise ValueError(f"expected one {block} {name}, found {len(found)}")
            written = value * factor if other_level else value
            edits.append((start + found[0].start(1), start + found[0].end(1), str(written)))
    return _apply(text, edits)


def set_parameter(text: str, key: str, value: str) -> str:
    """``text`` with the ``string_value`` of the ``parameters`` entry ``key`` replaced.

    The value is written as a quoted protobuf text string (backslashes, quotes and newlines
    escaped).

    Raises:
        ValueError: no entry with this key, or more than one.
    """
    masked = _mask(text)
    found = [
        m
        for m in _PARAMETER.finditer(masked)
        if text[m.start("key") : m.end("key")] == _escape(key)
    ]
    if len(found) != 1:
        raise ValueError(f'expected one parameters entry with key "{key}", found {len(found)}')
    m = found[0]
    return _apply(text, [(m.start("value"), m.end("value"), _escape(value))])


def add_parameters(text: str, parameters: Mapping[str, str], comment: str) -> str:
    """``text`` with entries appended to its ``parameters`` list, the last block of the file.

    For a step that one kind configures with more parameters than the shipped text has (the
    tokenizer step of a multi-vector model reads its spec). ``comment`` (one line) goes
    before them.

    Raises:
        ValueError: the text does not end with a ``parameters [ ... ]`` block, or a key is
            already in it.
    """
    end = text.rstrip().rfind("\n]")
    start = text.rfind("parameters [", 0, end)
    last = text.rfind("}", start, end)
    if start < 0 or last < 0 or text.rstrip()[end:] != "\n]":
        raise ValueError("expected the config to end with a parameters [ ... ] block")
    lines = [f"  # {comment}"]
    for key, value in parameters.items():
        if f'key: "{_escape(key)}"' in text[start:end]:
            raise ValueError(f'the parameters already have the key "{key}"')
        entry = f'key: "{_escape(key)}", value: {{ string_value: "{_escape(value)}" }}'
        lines.append(f"  {{ {entry} }}")
    added = ",\n".join(lines[1:])
    return text[: last + 1] + ",\n" + lines[0] + "\n" + added + text[last + 1 :]


# One map entry of `parameters`, as it looks after _mask: { key: "…" value: { string_value: "…" } }
# (commas and the colon before a message are optional in the text format).
_PARAMETER = re.compile(
    r'\{\s*key\s*:\s*"(?P<key>x*)"\s*,?\s*value\s*:?\s*\{\s*string_value\s*:\s*"(?P<value>x*)"'
)


def _escape(value: str) -> str:
    """The body of a protobuf text-format string holding ``value``."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _mask(text: str) -> str:
    """Blank the comments of ``text`` and turn the contents of its strings into ``x``.

    The result has the same length, so a search for fields never matches inside a comment or
    a value, and a match's offsets are offsets into ``text``.
    """
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            while i < n and text[i] != "\n":
                out[i] = " "
                i += 1
        elif c in "\"'":
            i += 1
            while i < n and text[i] != c and text[i] != "\n":
                step = 2 if text[i] == "\\" and i + 1 < n else 1
                out[i : i + step] = "x" * step
                i += step
            i += 1
        else:
            i += 1
    return "".join(out)


def _single_block(
    masked: str, field: str, within: int = 0, within_end: int | None = None
) -> tuple[int, int]:
    """Span of the one ``field [ ... ]`` or ``field { ... }`` block in masked text.

    ``within``/``within_end`` limit the search to a span (the inside of another block).
    """
    end = len(masked) if within_end is None else within_end
    pattern = re.compile(rf"\b{field}\s*:?\s*([\[{{])")
    found = list(pattern.finditer(masked, within, end))
    if len(found) != 1:
        raise ValueError(f"expected one {field} block, found {len(found)}")
    start = found[0].start(1)
    depth = 0
    for i in range(start, end):
        if masked[i] in "[{":
            depth += 1
        elif masked[i] in "]}":
            depth -= 1
            if depth == 0:
                return start, i + 1
    raise ValueError(f"{field} block is not closed")


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    """Replace the ``(start, end)`` spans of ``text``, last first so offsets stay valid."""
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text
