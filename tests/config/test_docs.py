"""docs/configuration.md is generated from the schemas, and the schemas are sound."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from kvtiers.config.docs import render
from kvtiers.config.schema import CORE_SCHEMA, properties
from kvtiers.plugins import load_registry

from .conftest import REPO


def test_docs_page_is_the_generated_one() -> None:
    page = (REPO / "docs" / "configuration.md").read_text()
    assert page == render(), (
        "docs/configuration.md is stale: run "
        "`.venv/bin/python -m kvtiers.config.docs > docs/configuration.md`"
    )


def test_docs_list_every_key() -> None:
    page = render()
    for key in properties(CORE_SCHEMA):
        assert f"| `{key}` |" in page
    registry = load_registry(entry_points=[], environ={})
    for name, reg in registry.tiers.items():
        assert f"### `{name}`" in page
        for key in properties(reg.record.schema):
            assert f"| `{key}` |" in page


def _schemas() -> list[tuple[str, Mapping[str, Any]]]:
    registry = load_registry(entry_points=[], environ={})
    return [("core", CORE_SCHEMA)] + [
        (n, r.record.schema) for n, r in sorted(registry.tiers.items())
    ]


@pytest.mark.parametrize(("name", "schema"), _schemas())
def test_schemas_are_valid_and_defaults_satisfy_them(name: str, schema: Mapping[str, Any]) -> None:
    Draft202012Validator.check_schema(schema)

    def walk(sub: Any, where: str) -> None:
        for key, prop in properties(sub).items():
            assert isinstance(prop, Mapping)
            assert prop.get("description"), f"{where}.{key} has no description"
            if "default" in prop:
                errors = list(Draft202012Validator(prop).iter_errors(prop["default"]))
                assert not errors, f"{where}.{key}: default {prop['default']!r} is invalid"
            walk(prop, f"{where}.{key}")

    walk(schema, name)
