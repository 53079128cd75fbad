import pytest

# Plain `assert`s in the conformance kit get pytest's detailed failure messages.
pytest.register_assert_rewrite("kvtiers.testing")
