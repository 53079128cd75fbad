"""Fixtures for the tests that drive vLLM's real scheduler and connector on CPU.

vLLM is an optional install (requirements-vllm.txt, `make setup`): without it these
tests are skipped, not failed. The harness is imported inside the fixtures, since it
imports vLLM.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .harness import Engine

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama config (no weights) every engine of the session loads."""
    from .harness import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def engine_id() -> Iterator[str]:
    """A fresh engine id; vLLM's shared CPU region files of it are removed after."""
    from .harness import new_engine_id, remove_shm

    eid = new_engine_id()
    yield eid
    remove_shm(eid)


MakeEngine = Callable[..., "Engine"]


@pytest.fixture
def make_engine(model_dir: Path, engine_id: str) -> Iterator[MakeEngine]:
    """`make_engine(extra_config, **Engine options)`: an `Engine` closed after the test.
    The first engine gets the test's `engine_id`; later ones (a restart) fresh ids."""
    from .harness import Engine, new_engine_id, remove_shm

    engines: list[Engine] = []

    def make(extra_config: dict[str, Any], **kwargs: Any) -> Engine:
        eid = engine_id if not engines else new_engine_id()
        engine = Engine(model_dir, extra_config, engine_id=eid, **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in reversed(engines):
        try:
            engine.close()
        finally:
            remove_shm(engine.engine_id)
