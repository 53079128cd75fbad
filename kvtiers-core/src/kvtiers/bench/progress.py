"""The live progress bar of `kvtiers bench` (rich), shown only on a terminal."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from kvtiers.bench.results import Counters
from kvtiers.bench.workload import WorkloadSpec
from kvtiers.humanize import format_bytes

Update = Callable[[int, float, Counters], None]


@contextlib.contextmanager
def progress_bar(
    enabled: bool, spec: WorkloadSpec, duration: float | None, label: str, console: Any
) -> Iterator[Update | None]:
    """Yields the replay's progress callback (None when `enabled` is false): a bar of
    requests done (or of seconds, with `duration`), the hit rate and bytes verified."""
    if not enabled:
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    total = duration if duration is not None else spec.requests
    columns = [TextColumn("{task.description}"), BarColumn()]
    columns.append(TextColumn("{task.fields[done]}") if duration else MofNCompleteColumn())
    columns += [TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}")]
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=total, info="", done="")

        def update(done: int, elapsed: float, c: Counters) -> None:
            hit = sum(c.served_tokens.values()) / c.prompt_tokens if c.prompt_tokens else 0.0
            info = f"hit {100 * hit:.0f}%  verified {format_bytes(c.verified_bytes)}"
            if duration is not None:
                bar.update(
                    task, completed=min(elapsed, duration), info=info, done=f"{done:,} requests"
                )
            else:
                bar.update(task, completed=done, info=info)

        yield update
