"""Backend URLs with some query items taken out (``schema``, ``prefix``,
``pool_mode``, ``listen``).

The items left are kept as they were written, byte for byte: libpq does
not decode ``+`` as a space, so decoding and encoding them again would
change what it reads (``options=-c%20statement_timeout%3D5s``). And
``urllib.parse.urlunsplit`` would drop the ``//`` of an empty authority
(``postgresql:///db``, the default unix socket), so the query is cut out
of the text rather than rebuilt.
"""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import unquote


def without(url: str, names: Collection[str]) -> tuple[str, dict[str, str]]:
    """``url`` without the query items named ``names``, and those items'
    values (percent-decoded; the last one wins where a name repeats). The
    fragment, if any, is kept."""
    base, hash_mark, fragment = url.partition("#")
    head, question, query = base.partition("?")
    if not question:
        return url, {}
    taken: dict[str, str] = {}
    kept: list[str] = []
    for item in query.split("&"):
        name, _, value = item.partition("=")
        if unquote(name) in names:
            taken[unquote(name)] = unquote(value)
        elif item:
            kept.append(item)
    rest = "&".join(kept)
    return head + ("?" + rest if rest else "") + hash_mark + fragment, taken
