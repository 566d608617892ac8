"""API bearer tokens with scopes, read from the settings and checked in constant time."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path

from tracelake.warehouse import Forbidden, InvalidArgument, Unauthorized

from .settings import ServerSettings

#: What a token may be allowed to do. ``admin`` implies the other two, ``write`` implies ``read``.
SCOPES = ("read", "write", "admin")
_IMPLIED = {"admin": {"admin", "write", "read"}, "write": {"write", "read"}, "read": {"read"}}


@dataclass(frozen=True)
class _Token:
    digest: bytes  # SHA-256 of the secret: every comparison is between equal-length values
    scopes: frozenset[str]


class Tokens:
    """The configured API tokens; with none configured every request is allowed (loopback-only serving)."""

    def __init__(self, tokens: dict[str, set[str]]) -> None:
        self._tokens = [_Token(_digest(secret), frozenset(scopes)) for secret, scopes in tokens.items()]

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> Tokens:
        """Tokens from ``TRACELAKE_TOKENS`` and the file named by ``TRACELAKE_TOKENS_FILE``.

        Raises:
            InvalidArgument: a token entry or its scopes cannot be read.
        """
        tokens: dict[str, set[str]] = {}
        for n, entry in enumerate(settings.tokens.split(";"), 1):
            if entry.strip():
                _add(tokens, entry, f"TRACELAKE_TOKENS entry {n}")
        if settings.tokens_file:
            path = Path(settings.tokens_file).expanduser()
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise InvalidArgument(f"cannot read the tokens file {path}: {exc}") from None
            for n, line in enumerate(lines, 1):
                line = line.split("#", 1)[0].strip()
                if line:
                    _add(tokens, line, f"{path} line {n}")
        return cls(tokens)

    @property
    def configured(self) -> bool:
        """True when at least one token is configured (requests must then carry one)."""
        return bool(self._tokens)

    def scopes(self, authorization: str | None) -> frozenset[str]:
        """The scopes an ``Authorization`` header grants.

        Raises:
            Unauthorized: tokens are configured and the header carries none of them.
        """
        if not self._tokens:
            return frozenset(SCOPES)
        scheme, _, secret = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise Unauthorized("this server needs an API token: send `Authorization: Bearer <token>`")
        offered = _digest(secret.strip())
        granted: frozenset[str] | None = None
        for token in self._tokens:  # compare with every token: the time taken says nothing about which matched
            if hmac.compare_digest(offered, token.digest):
                granted = token.scopes
        if granted is None:
            raise Unauthorized("the API token is not valid")
        return granted


def require(granted: frozenset[str], scope: str) -> None:
    """Raise :class:`Forbidden` unless the ``granted`` scopes include (or imply) ``scope``."""
    if not any(scope in _IMPLIED[g] for g in granted):
        raise Forbidden(f"this token lacks the {scope!r} scope")


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8")).digest()


def _add(tokens: dict[str, set[str]], entry: str, where: str) -> None:
    secret, sep, scopes_text = entry.strip().rpartition(":")
    secret = secret.strip()
    if not sep or not secret:
        raise InvalidArgument(f"{where}: expected token:scopes, e.g. s3cret:read,write")
    scopes = {s.strip() for s in scopes_text.split(",") if s.strip()}
    unknown = scopes - set(SCOPES)
    if not scopes or unknown:
        problem = f"unknown scope {sorted(unknown)[0]!r}" if unknown else "no scopes given"
        raise InvalidArgument(f"{where}: {problem} (scopes are {', '.join(SCOPES)})")
    if len(secret) < 8:
        raise InvalidArgument(f"{where}: a token must be at least 8 characters long")
    tokens[secret] = scopes
