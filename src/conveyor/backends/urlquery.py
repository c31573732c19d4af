"""Backend URLs with some query parameters taken out (``schema``, ``prefix``).

``urllib.parse.urlunsplit`` drops the ``//`` of an empty authority: it would
turn ``postgresql:///db`` (the default unix socket) into ``postgresql:/db``,
which libpq rejects. So the query is replaced in the text as written, and
everything before it is kept byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlencode


def with_query(url: str, query: Mapping[str, str]) -> str:
    """``url`` with its query (``?...``) replaced by ``query`` (none if
    empty); its fragment, if any, kept."""
    base, hash_mark, fragment = url.partition("#")
    head = base.partition("?")[0]
    text = urlencode(query)
    return head + ("?" + text if text else "") + hash_mark + fragment
