"""kvtiers-s3's metadata installs with the pips users have: boto3 comes through
s3fs's `boto3` extra (the release that matches s3fs's aiobotocore), never as a
separate requirement that pip 23.2 backtracks over until ResolutionImpossible; the
license is an SPDX expression (no setuptools deprecation warning on install)."""

from __future__ import annotations

import tomllib

from packaging.requirements import Requirement

from .conftest import REPO

PYPROJECT = REPO / "kvtiers-s3" / "pyproject.toml"


def _project() -> dict[str, object]:
    with PYPROJECT.open("rb") as f:
        doc = tomllib.load(f)
    project: dict[str, object] = doc["project"]
    assert any(r.startswith("setuptools>=77") for r in doc["build-system"]["requires"])
    return project


def test_boto3_comes_with_the_s3fs_that_matches_it() -> None:
    deps = [Requirement(d) for d in _project()["dependencies"]]  # type: ignore[union-attr]
    names = {d.name for d in deps}
    assert not names & {"boto3", "botocore", "aiobotocore"}, names
    (s3fs,) = [d for d in deps if d.name == "s3fs"]
    assert s3fs.extras == {"boto3"}


def test_the_license_is_an_spdx_expression() -> None:
    assert _project()["license"] == "Apache-2.0"
