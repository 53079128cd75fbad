"""The package's own errors. Builtin exceptions are used where they fit
(FileNotFoundError, TimeoutError, PermissionError); these cover the rest."""

from __future__ import annotations


class KvtiersError(Exception):
    """Base class of every error kvtiers raises on purpose."""


class ConfigError(KvtiersError):
    """One or more problems in a configuration document.

    Each problem is a `ConfigProblem` carrying the JSON path of the field, so a
    front end can print one line per problem.
    """

    def __init__(self, problems: list[ConfigProblem] | ConfigProblem | str):
        if isinstance(problems, str):
            problems = [ConfigProblem("$", problems)]
        elif isinstance(problems, ConfigProblem):
            problems = [problems]
        self.problems: list[ConfigProblem] = problems
        super().__init__("\n".join(str(p) for p in problems))


class _Remark:
    """Where in a config (a JSON path such as `$.secondary_tiers[0].type`) and what."""

    __slots__ = ("path", "message")

    def __init__(self, path: str, message: str):
        self.path = path
        self.message = message

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}, {self.message!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and (self.path, self.message) == (
            other.path, other.message)

    def __hash__(self) -> int:
        return hash((self.path, self.message))


class ConfigProblem(_Remark):
    """One problem in a config: where and what (found vs allowed, in words)."""

    __slots__ = ()


class PluginError(KvtiersError):
    """A plugin that cannot be used: failed to import, targets another contract
    version, or registers a name another distribution registers too."""


class MissingExtraError(KvtiersError, ImportError):
    """A feature needs an optional dependency that is not installed (torch, for the
    worker side and the bench). `extra` names the kvtiers-core extra that brings it
    (`pip install 'kvtiers-core[<extra>]'`); the message says how to install it.
    An `ImportError`, so `except ImportError` around an optional feature still works."""

    def __init__(self, message: str, *, extra: str, package: str):
        super().__init__(message, name=package)
        self.extra = extra
        self.package = package


class UnknownNameError(KvtiersError, LookupError):
    """A tier or policy name nobody registered; the message lists the installed ones."""


class ConfigNote(_Remark):
    """Something worth knowing about a valid config, found by a tier's machine check
    (`TierRecord.check` may return these among its problems): where and what.
    `kvtiers validate` prints it; nothing is refused."""

    __slots__ = ()


class ConfigWarning(_Remark):
    """Something a tier's machine check (`TierRecord.check`) found that will likely
    go wrong but need not (a capacity above the free space now): where and what.
    `kvtiers validate` prints it as a warning; nothing is refused."""

    __slots__ = ()


__all__ = [
    "ConfigError",
    "ConfigNote",
    "ConfigProblem",
    "ConfigWarning",
    "KvtiersError",
    "MissingExtraError",
    "PluginError",
    "UnknownNameError",
]
