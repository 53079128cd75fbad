"""Credentials in free-form options (fsspec's `storage_options`, a client's keyword
arguments) are found by name and blanked in messages; everything a user needs to act
on a message - an endpoint URL, a region, a bucket - stays readable."""

from __future__ import annotations

import secrets

from kvtiers.ops.snapshot_errors import describe_error
from kvtiers.sdk import credential_values, scrub


def test_credentials_are_found_by_name_at_any_depth() -> None:
    key, secret, token = (secrets.token_hex(8) for _ in range(3))
    options = {"endpoint_url": "http://127.0.0.1:8333", "key": key, "region_name": "eu-1",
               "client_kwargs": {"aws_secret_access_key": secret},
               "config_kwargs": [{"session_token": token}, {"retries": "3"}],
               "password": ""}
    assert credential_values(options) == [key, secret, token]


def test_scrub_blanks_credentials_longest_first_and_keeps_the_endpoint() -> None:
    secret = secrets.token_hex(8)
    text = f"http://127.0.0.1:8333/warm?list-type=2 denied for {secret}{secret[:4]}"
    out = scrub(text, [secret[:4], secret + secret[:4]])
    assert out == "http://127.0.0.1:8333/warm?list-type=2 denied for ***"


def test_short_values_are_no_credentials() -> None:
    assert scrub("a b c", ["a", "b"]) == "a b c"


def test_a_snapshot_error_shows_the_endpoint_but_not_the_secret() -> None:
    secret = secrets.token_hex(12)
    endpoint = "http://127.0.0.1:8333"
    exc = PermissionError(f"GET {endpoint}/warm?list-type=2 signed with {secret}: denied")
    text = describe_error(exc, {"endpoint_url": endpoint, "secret": secret, "key": "admin-key"})
    assert text == (f"PermissionError: GET {endpoint}/warm?list-type=2 signed with ***: "
                    "denied")
