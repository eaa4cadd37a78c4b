"""Markdown tables: what the CLI prints and the reports write are the same text."""

from collections.abc import Sequence


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str = "") -> str:
    """A padded Markdown table; `align` is one letter per column ('l' or 'r', default left)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    align = align.ljust(len(headers), "l")

    def line(row: Sequence[str]) -> str:
        padded = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(row, widths, align)]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(("-" * (w + 1) + ":") if a == "r" else ("-" * (w + 2)) for w, a in zip(widths, align))
        + "|"
    )
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


def si(value: float, digits: int = 3) -> str:
    """1234567 -> '1.23M'."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g}{unit}"
    return f"{value:.{digits}g}"


def format_seconds(seconds: float) -> str:
    """12s, 3m05s, 1h02m: durations in progress lines and plans."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
