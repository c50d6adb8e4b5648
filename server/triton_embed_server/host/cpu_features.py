"""Which reduced-precision instructions this host's CPUs have, and the engine dtype they allow.

vLLM's CPU backend runs ``dtype="bfloat16"`` on any x86-64 CPU, but only fast where the
cores multiply bfloat16 in hardware: AVX512_BF16 (Intel Cooper Lake and later, AMD Zen 4
and later) or AMX_BF16 (Intel Sapphire Rapids and later). Without them oneDNN emulates
bfloat16 and the engine runs slower than in float32, so :func:`engine_dtype` falls back to
float32 there and says why (the embedder logs it). The flags are the kernel's names in
``/proc/cpuinfo`` (``flags`` lines; Linux ``arch/x86/include/asm/cpufeatures.h``).
AVX512_VNNI (or AVX-VNNI, or AMX_INT8) is int8's (``vpdpbusd``): without it vLLM's int8
kernels take oneDNN's AVX2 path, measured here far off float32 (cosine to the float32
vectors down to 0.49 on a test model, where VNNI hosts give 0.99), so :func:`int8_note`
says so wherever int8 is made or served.
"""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
#: The instructions that make bfloat16 matrix multiplies fast, best first.
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
#: The instructions of int8 dot products (u8 x s8 -> s32), best first.
INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")
#: Engine dtypes that need one of :data:`BF16_FLAGS` on a CPU to be worth running.
NEEDS_BF16 = frozenset({"bfloat16"})


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The instruction flags every CPU of this host lists (their intersection).

    Args:
        cpuinfo: the text of ``/proc/cpuinfo``; ``None`` reads it (empty when unreadable,
            e.g. on a host that is not Linux).

    Returns:
        The lowercase flag names that every ``flags`` line holds; empty when none is found.
    """
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text(errors="replace")
        except OSError:
            return frozenset()
    common: set[str] | None = None
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            flags = set(value.lower().split())
            common = flags if common is None else common & flags
    return frozenset(common or ())


def bf16_instruction(flags: frozenset[str]) -> str | None:
    """The best of :data:`BF16_FLAGS` that ``flags`` holds, or ``None``."""
    return next((f for f in BF16_FLAGS if f in flags), None)


def int8_note(flags: frozenset[str]) -> str | None:
    """Why int8 is not to be trusted on these CPUs (None where they have an int8 instruction).

    Args:
        flags: :func:`cpu_flags` of the host.
    """
    if any(f in flags for f in INT8_FLAGS):
        return None
    return (
        f"these CPUs have none of {', '.join(INT8_FLAGS)} (/proc/cpuinfo flags): vLLM's int8 "
        "kernels run on oneDNN's AVX2 path here, measured far off float32 (cosine down to "
        "0.49 on a test model); make and serve int8 models on CPUs with VNNI, or serve "
        "float32 or bfloat16 here"
    )


def engine_dtype(requested: str, flags: frozenset[str]) -> tuple[str, str | None]:
    """The dtype a CPU engine runs for a configured ``dtype``, and why it differs.

    Args:
        requested: the embedder's ``dtype`` parameter (``float32``, ``bfloat16``, ...).
        flags: :func:`cpu_flags` of the host.

    Returns:
        ``(dtype, note)``: ``requested`` and ``None`` when the host runs it fast;
        ``("float32", why)`` for bfloat16 on CPUs without :data:`BF16_FLAGS` (``why`` is one
        line for the log: what was asked, what is missing, what runs instead).
    """
    if requested not in NEEDS_BF16 or bf16_instruction(flags) is not None:
        return requested, None
    return "float32", (
        f"dtype {requested} asked for, but these CPUs have none of "
        f"{', '.join(BF16_FLAGS)} (/proc/cpuinfo flags): bfloat16 would be emulated and "
        "slower, so the engine runs float32; set dtype float32 to silence this"
    )
