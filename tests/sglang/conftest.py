"""Fixtures for kvtiers-sglang's tests: SGLang's real storage classes on CPU.

SGLang is an optional install (requirements-sglang.txt, `make setup`): without it
these tests are skipped, not failed.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("sglang") is None:
    collect_ignore_glob = ["test_*.py"]
