"""Peer authentication with ZeroMQ CURVE and an allow-list of public keys.

A server with CURVE accepts only clients whose public key is in its allow-list (a
directory of public key files, checked by a ZAP authenticator thread on the
server's context): an unlisted or unauthenticated client never completes the
ZeroMQ handshake, so it cannot send a single protocol message. A puller needs its
own key pair and the server's public key.

Keys live in files made by `keygen` (`kvtiers p2p keygen`): `NAME.key` (public,
0644) and `NAME.key_secret` (secret, 0600). A secret key file that others can read
is refused. Keys never reach a log: errors name the file, not its contents.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from kvtiers.errors import KvtiersError

__all__ = ["CurveKeys", "KeyFileError", "keygen", "load_public", "load_secret"]


#: the ZAP domain of the servers' sockets (the authenticator's keys are per domain)
ZAP_DOMAIN = "kvtiers-p2p"


class KeyFileError(KvtiersError):
    """A key file is missing, malformed or readable by others."""


def keygen(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write a new key pair `NAME.key` / `NAME.key_secret` into `directory`
    (created 0700 if missing); the secret file is 0600. Refuses to overwrite."""
    d = Path(directory)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    public, secret = d / f"{name}.key", d / f"{name}.key_secret"
    for path in (public, secret):
        if path.exists():
            raise FileExistsError(f"{path} exists; remove it first or choose another name")
    old = os.umask(0o077)
    try:
        made_public, made_secret = zmq.auth.create_certificates(str(d), name)
    finally:
        os.umask(old)
    os.chmod(made_secret, 0o600)
    os.chmod(made_public, 0o644)
    return Path(made_public), Path(made_secret)


def load_secret(path: str | Path) -> tuple[bytes, bytes]:
    """(public, secret) from a `.key_secret` file that only its owner can read."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except OSError as exc:
        raise KeyFileError(f"secret key file {p}: {exc.strerror}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"secret key file {p} is accessible by others (mode {stat.S_IMODE(mode):o}); "
            f"chmod 600 {p}")
    public, secret = _load(p)
    if secret is None:
        raise KeyFileError(f"{p} holds no secret key (a public key file?)")
    return public, secret


def load_public(path: str | Path) -> bytes:
    public, _ = _load(Path(path))
    return public


def _load(path: Path) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"key file {path} cannot be read as a CURVE key: "
                           f"{type(exc).__name__}") from exc
    if public is None or len(public) != 40:
        raise KeyFileError(f"key file {path} holds no valid public key")
    return public, secret


@dataclass(frozen=True)
class CurveKeys:
    """One side's CURVE settings. Server: `allowed_dir` holds the public key files
    of the clients it accepts. Puller: `server_public` is the server's public key."""

    public: bytes
    secret: bytes
    allowed_dir: str | None = None
    server_public: bytes | None = None

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> CurveKeys:
        public, secret = load_secret(section["secret_key_file"])
        allowed = section.get("allowed_keys_dir")
        if allowed is not None and not Path(allowed).is_dir():
            raise KeyFileError(f"allowed_keys_dir {allowed} is not a directory")
        server_file = section.get("server_public_key_file")
        server = load_public(server_file) if server_file else None
        return cls(public, secret, allowed, server)

    def apply_server(self, sock: zmq.Socket[Any]) -> None:
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True
        sock.zap_domain = ZAP_DOMAIN.encode()

    def apply_client(self, sock: zmq.Socket[Any]) -> None:
        if self.server_public is None:
            raise KeyFileError("curve: a puller needs server_public_key_file")
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_serverkey = self.server_public

    def start_authenticator(self, context: zmq.Context[Any]) -> Any:
        """The ZAP handler of a server's context: only keys in `allowed_dir` pass
        (none at all without one). Returns it; `stop()` it after the socket closes."""
        from zmq.auth.thread import ThreadAuthenticator

        auth = ThreadAuthenticator(context)
        auth.start()
        if self.allowed_dir is not None:
            auth.configure_curve(domain=ZAP_DOMAIN, location=self.allowed_dir)
        else:
            auth.configure_curve(domain=ZAP_DOMAIN, location=os.devnull)
        return auth
