"""Which vLLM kvtiers-vllm runs inside: the installed one must be of a supported minor
(a release installed without being added fails here, loudly), another version is
refused naming both, and the entry point stays out of an unsupported vLLM."""

from __future__ import annotations

import importlib
import importlib.metadata as md
import logging
from typing import Any

import pytest

pytest.importorskip("vllm")

from kvtiers_vllm import compat
from kvtiers_vllm.compat import versions
from kvtiers_vllm.plugin import register
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

SUPPORTED_TEXT = r"supported: vLLM 0\.33\.x, 0\.34\.x"


def test_the_installed_vllm_is_of_a_supported_minor() -> None:
    """A newly released vLLM minor installed (a bumped pin, a second venv) without
    being added to `SUPPORTED` fails here: adding it is a decision, made after the
    suite passed on it, never a silent refusal at a user's start-up."""
    installed = md.version("vllm")
    minor = compat.minor_of(installed)
    assert minor in compat.SUPPORTED, (
        f"vLLM {installed} is installed, but kvtiers-vllm supports {compat.SUPPORTED}: "
        f"run tests/vllm on it, then add {minor!r} to kvtiers_vllm.compat.versions.SUPPORTED"
    )
    assert compat.require_vllm() == installed


@pytest.mark.parametrize(
    ("version", "minor"),
    [
        ("0.33.0", "0.33"),
        ("0.34.1rc2", "0.34"),
        ("0.34.0+cu129", "0.34"),
        ("0.35.0.dev12+g1234", "0.35"),
        ("1.0", "1.0"),
        ("0", None),
        ("nightly", None),
        ("0.x", None),
    ],
)
def test_minor_of(version: str, minor: str | None) -> None:
    assert compat.minor_of(version) == minor


def test_supported_versions_pass_and_others_are_refused_naming_both() -> None:
    for good in ("0.33.0", "0.33.4", "0.33.1rc2", "0.33.0+cu129", "0.34.0", "0.34.2rc1"):
        assert compat.require_vllm(good) == good
    for bad in ("0.35.0", "0.32.9", "0.3.3", "0.330.0", "1.33.0"):
        with pytest.raises(compat.UnsupportedVllmError, match=rf"vLLM {bad} \({SUPPORTED_TEXT}\)"):
            compat.require_vllm(bad)


def test_version_check_when_vllm_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "installed_vllm", lambda: None)
    with pytest.raises(
        compat.UnsupportedVllmError, match=rf"not installed \({SUPPORTED_TEXT}; .*vllm==0\.34\.\*"
    ):
        compat.require_vllm()


def test_on_an_unsupported_vllm_the_tier_refuses_and_the_plugin_stays_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Importing the tier module checks the version; the entry point warns and
    registers nothing, so vLLM itself keeps working."""
    import kvtiers_vllm.plugin
    import kvtiers_vllm.tier

    monkeypatch.setattr(versions, "installed_vllm", lambda: "0.35.1")
    with pytest.raises(compat.UnsupportedVllmError, match=rf"0\.35\.1 \({SUPPORTED_TEXT}\)"):
        importlib.reload(kvtiers_vllm.tier)
    monkeypatch.setattr(kvtiers_vllm.plugin, "installed_vllm", lambda: "0.35.1")

    def refuse(*args: Any) -> None:
        raise AssertionError("registered on an unsupported vLLM")

    monkeypatch.setattr(SecondaryTierFactory, "register_tier", refuse)
    monkeypatch.setattr(OffloadingSpecFactory, "register_spec", refuse)
    with caplog.at_level(logging.WARNING, logger="kvtiers_vllm.plugin"):
        register()
    assert "not registering with vLLM 0.35.1 (supported: vLLM 0.33.x, 0.34.x)" in caplog.text
