"""Secrets in store URLs, hidden before anything shows them.

A store URL can carry a password in several places, whatever its scheme
(``postgresql``, ``redis``, ``rediss``, ``unix``, one conveyor does not
know). :func:`redact_url` shows each as ``***``:

- the password of the userinfo (``postgresql://user:pw@host``,
  ``redis://:pw@host``, ``unix://:pw@/path``), percent-encoded or not: a
  password written with raw ``@ : / ? # &`` or spaces (a URL that does not
  parse cleanly) is hidden up to the last ``@`` that can end it;
- the value of a query item whose name, percent-decoded and in any case,
  contains ``password``, ``passwd``, ``passphrase``, ``secret`` or
  ``token`` (``?password=``, ``?sslpassword=``: the passphrase of libpq's
  ``sslkey``). A value runs up to the next ``&name=`` item, so a raw
  ``&`` or ``#`` in it is hidden too; an item of another name without
  ``=`` or with an empty value is hidden whole (``?passwordSECRET``: its
  name holds the secret);
- the same names in libpq's keyword/value form (``host=db password=pw``,
  ``password = 'p w'``; after an unterminated quote, the rest of the text).

It reads any text (an error message that quotes a URL, too) and never
raises. When in doubt it hides more than the secret: a URL whose path
holds an ``@`` (``postgresql://h:5432/a@b``) is read as a userinfo ending
there. :func:`redact_message` also hides, in a driver's message about a
URL, each piece of that URL which :func:`redact_url` hides, wherever the
message quotes it.

Not hidden: a secret under a name none of the rules above names
(``?sslkey=`` is a path; its passphrase is ``sslpassword``); a libpq
keyword written without ``=`` (``password pw``, which libpq refuses
anyway); a raw password holding ``?name=`` or ``#name=`` that also
holds an ``@`` before it or starts with digits (``user:a@b?c=d@host``
and ``user:12?c=d@host`` read as a host and a query): percent-encode it.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

__all__ = ["MASK", "redact_message", "redact_url"]

MASK = "***"
"""What a hidden secret is shown as."""

SECRET_WORDS = ("password", "passwd", "passphrase", "secret", "token")
"""A query item or libpq keyword whose name contains one of these holds a secret."""

_OPTIONS = frozenset({"sslpassword", "client_secret", "access_token"})
_AUTHORITY = re.compile(r"//")
_NETLOC_END = re.compile(r"[/?#]")
_QUERY_STOP = re.compile(r"[?#\s]")
_QUERY_NAME = re.compile(r"[A-Za-z_][\w.%-]*=")
_QUERY_VALUE = re.compile(r"(?<=[?&])([^=&#\s]+)=(.*?)(?=&[^=&#\s]*=|\s|$)")
_QUERY_BARE = re.compile(r"(?<=[?&])([^=&#\s]+)(?=[&#\s]|$)")
_KEYWORD_VALUE = re.compile(r"(?<!\S)([A-Za-z_][\w.-]*)(\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)")


def redact_url(text: str) -> str:
    """``text`` (a store URL, a libpq conninfo string, or a message quoting
    either) with every secret the module docstring lists shown as ``***``.
    Never raises: should its own reading fail, it returns ``***`` alone."""
    try:
        return _masked(text, [])
    except Exception:  # a bug here must not show the text
        return MASK


def redact_message(message: str, url: str) -> str:
    """``message`` (say, a driver's error about ``url``) with the secrets of
    ``url`` hidden wherever it quotes them, raw or percent-decoded (libpq's
    ``invalid percent-encoded token: "..."`` quotes a piece of the
    password), then passed through :func:`redact_url`. Never raises."""
    try:
        found: list[str] = []
        _masked(url, found)
        pieces = {piece for secret in found for piece in (secret, unquote(secret))}
        for piece in sorted(pieces, key=len, reverse=True):
            if piece and piece != MASK:
                message = message.replace(piece, MASK)
        return _masked(message, [])
    except Exception:  # a bug here must not show the message
        return MASK


def _masked(text: str, found: list[str]) -> str:
    """``text`` redacted; each hidden piece is appended to ``found``."""
    text = _without_passwords(text, found)

    def query_value(match: re.Match[str]) -> str:
        if not _names_secret(match[1]):
            return match[0]
        if match[2]:
            found.append(match[2])
        elif not _is_option(match[1]):  # "?passwordSECRET=": the name holds it
            found.append(match[1])
            return MASK
        return f"{match[1]}={MASK}"

    def query_bare(match: re.Match[str]) -> str:
        if not _names_secret(match[1]) or _is_option(match[1]):
            return match[0]
        found.append(match[1])
        return MASK

    def keyword_value(match: re.Match[str]) -> str:
        if not _names_secret(match[1]) or not match[3]:
            return match[0]
        found.extend((match[3], match[3].strip("'")))
        return f"{match[1]}{match[2]}{MASK}"

    text = _QUERY_VALUE.sub(query_value, text)
    text = _QUERY_BARE.sub(query_bare, text)
    return _KEYWORD_VALUE.sub(keyword_value, text)


def _is_option(name: str) -> bool:
    """Whether ``name`` is one of the names themselves (``sslpassword``), so
    holds nothing secret: hiding it in a message would hide words."""
    folded = unquote(name).lower()
    return folded in SECRET_WORDS or folded in _OPTIONS


def _names_secret(name: str) -> bool:
    folded = unquote(name).lower()
    return any(word in folded for word in SECRET_WORDS)


def _without_passwords(text: str, found: list[str]) -> str:
    """``text`` with the userinfo password of each URL in it hidden."""
    shown: list[str] = []
    start = 0
    while (match := _AUTHORITY.search(text, start)) is not None:
        begin = match.end()
        span = _password_span(text[begin:])
        if span is None:
            shown.append(text[start:begin])
            start = begin
            continue
        first, last = begin + span[0], begin + span[1]
        found.append(text[first:last])
        shown.append(text[start:first] + MASK)
        start = last
    shown.append(text[start:])
    return "".join(shown)


def _password_span(rest: str) -> tuple[int, int] | None:
    """Where the password is in ``rest`` (what follows a ``//``), if any.

    The userinfo ends at the last ``@`` before the query or the fragment
    (see :func:`_query_start`): a ``/``, ``?``, ``#`` or second ``@`` in a
    raw password is read as part of it. With no ``@`` there, a ``:`` that
    does not start a port (``host:5432``), followed by an ``@`` further on,
    begins a password holding a raw ``?name=``: it runs to the last ``@``."""
    end = _first(rest, _NETLOC_END, 0)
    at = rest.rfind("@", 0, _query_start(rest, end))
    if at >= 0:
        colon = rest.find(":", 0, at)
        return (colon + 1, at) if colon >= 0 else None
    netloc = rest[:end]
    colon = netloc.find(":")
    last_at = rest.rfind("@")
    if colon < 0 or last_at < 0 or netloc.startswith("["):
        return None
    if colon > 0 and netloc[colon + 1 :].isdigit():
        return None  # host:port
    return colon + 1, last_at


def _query_start(rest: str, end: int) -> int:
    """Where the query or the fragment begins in ``rest``, from ``end``: at
    a ``?`` or ``#`` followed by ``name=`` (one that is not, as in
    ``redis://:pa?ss@host``, is in a raw password), or at a space (a URL in
    a message ends there); else the end of ``rest``."""
    for stop in _QUERY_STOP.finditer(rest, end):
        if stop[0].isspace() or _QUERY_NAME.match(rest, stop.end()):
            return stop.start()
    return len(rest)


def _first(text: str, pattern: re.Pattern[str], start: int) -> int:
    """The index of the first match of ``pattern`` in ``text`` from ``start``, else its length."""
    found = pattern.search(text, start)
    return found.start() if found else len(text)
