"""What bench/s3_bench.py prints: percentiles, the table of rows (latency per
request; the tier's rows also per job, submit to result)."""

from __future__ import annotations

from typing import Any

__all__ = ["KiB", "MiB", "pct", "table"]

KiB, MiB = 1 << 10, 1 << 20


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'server':<10} {'block':>7} {'client':<22} {'layout':<16} {'conc':>4} "
            f"{'op':<14} {'MB/s':>8} {'req':>5} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'job p50':>8} {'job p99':>8}")
    lines = [head, "-" * len(head)]
    key = lambda r: (r["server"], -r["block_bytes"], r["op"].split("-")[0], r["client"],  # noqa: E731
                     r["layout"], r["concurrency"], r["op"])
    for r in sorted(rows, key=key):
        block = f"{r['block_bytes'] // KiB}K" if r["block_bytes"] < MiB else \
            f"{r['block_bytes'] // MiB}M"
        jobs = "".join(f" {r[k]:>8.1f}" if k in r else f" {'-':>8}"
                       for k in ("job_p50_ms", "job_p99_ms"))
        lines.append(f"{r['server']:<10} {block:>7} {r['client']:<22} {r['layout']:<16} "
                     f"{r['concurrency']:>4} {r['op']:<14} {r['mb_s']:>8.0f} {r['requests']:>5} "
                     f"{r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f}{jobs}")
    return "\n".join(lines)
