"""Numbers and tables as the plan prints them: bytes, rates, seconds, dollars, SI prefixes.
"""
import math

from .constants import GIB, MIB


# ---------------------------------------------------------------------------------------------------
# Text output

def fmt_bytes(n):
    n = float(n)
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    if n >= MIB:
        return f"{n / MIB:.1f} MiB"
    if n >= 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{n:.0f} B"


def fmt_rate(bytes_per_s):
    return f"{bytes_per_s / 1e9:.2f} GB/s" if bytes_per_s >= 1e9 else f"{bytes_per_s / 1e6:.1f} MB/s"


def fmt_seconds(s):
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def fmt_usd(x):
    if x is None:
        return "-"
    if x >= 100:
        return f"${x:,.0f}"
    if x >= 0.995:
        return f"${x:.2f}"
    if x >= 0.001:
        return f"${x:.3f}"
    return "<$0.001"


def fmt_si(x):
    """29e6 -> "29.0 M": a count with a decimal prefix."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.1f} {prefix}"
    return f"{x:.0f}"


def fmt_count(n):
    return f"{n:,.0f}"


def fmt_cores(x):
    """CPU cores, rounded up: 11.08 -> "12" (a part of a core is a core to have)."""
    return f"{math.ceil(x - 1e-9):,}"


def table(headers, rows, right=()):
    """Columns separated by two spaces; columns named in `right` right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    lines = []
    for cells in [headers] + rows:
        parts = [str(c).rjust(w) if h in right else str(c).ljust(w) for c, w, h in zip(cells, widths, headers)]
        lines.append("  ".join(parts).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
