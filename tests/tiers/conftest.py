from collections.abc import Iterator

import pytest
from kvtiers.contract.tier import SecondaryTier

# Plain `assert`s in the conformance kit get pytest's detailed failure messages.
pytest.register_assert_rewrite("kvtiers.testing")


@pytest.fixture
def tiers() -> Iterator[list[SecondaryTier]]:
    """Tiers a test opens; closed after it."""
    opened: list[SecondaryTier] = []
    yield opened
    for t in opened:
        t.close()
