"""A kvtiers tier whose loads are still "writing" after their deadline: `Gate` holds
a tier's loads until the test opens it, then runs each to the end without its
deadline (as a read already under way at its deadline would). The tier's `drain`
opens the gate and waits, as a real tier's drain waits for its running I/O."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any


class Gate:
    """Holds the kvtiers tier's loads until `open()`: each is submitted to the tier
    from a thread of its own once the gate opens, without its deadline (a read under
    way does not stop at it). `drain` opens the gate and waits. `hold`: how many
    loads are held (the first ones); later ones go to the tier at once (None: all
    are held)."""

    def __init__(self, tier: Any, hold: int | None = None) -> None:
        self.inner = tier
        self.opened = threading.Event()
        self.threads: list[threading.Thread] = []
        self.submitted = 0  # loads held (jobs)
        self.blocks = 0  # ... and their blocks
        self.passed = 0  # loads past `hold`, not held
        submit, drain = self.inner.submit_load, self.inner.drain

        def held_submit(job: Any) -> None:
            if hold is not None and self.submitted >= hold:
                self.passed += 1
                submit(job)
                return

            def run() -> None:
                self.opened.wait()
                submit(dataclasses.replace(job, deadline=None))

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            self.threads.append(thread)
            self.submitted += 1
            self.blocks += len(job.keys)

        def waiting_drain(timeout: float | None = None) -> bool:
            self.open()
            return bool(drain(timeout))

        self.inner.submit_load = held_submit
        self.inner.drain = waiting_drain

    def open(self) -> None:
        self.opened.set()
        for thread in self.threads:
            thread.join()
