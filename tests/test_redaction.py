"""One redaction of a store URL's secrets, whatever form the URL takes."""

from __future__ import annotations

import re
from urllib.parse import quote

import psycopg
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict

import conveyor
from conveyor.backends import backend_from_url
from conveyor.redaction import redact_message, redact_url

SHOWN = [
    # The userinfo's password, on any scheme.
    ("postgresql://ada:SECRET@db:5432/app", "postgresql://ada:***@db:5432/app"),
    ("postgres://:SECRET@db/app", "postgres://:***@db/app"),
    ("redis://:SECRET@cache:6379/0", "redis://:***@cache:6379/0"),
    ("redis://default:SECRET@cache/0?prefix=p", "redis://default:***@cache/0?prefix=p"),
    ("rediss://:SECRET@cache:6380/2", "rediss://:***@cache:6380/2"),
    ("unix://:SECRET@/run/redis.sock?db=0", "unix://:***@/run/redis.sock?db=0"),
    ("postgresql+psycopg://ada:SECRET@db/app", "postgresql+psycopg://ada:***@db/app"),
    ("redis+sentinel://:SECRET@s1:26379/m", "redis+sentinel://:***@s1:26379/m"),
    ("//ada:SECRET@db/app", "//ada:***@db/app"),
    ("postgresql://ada:SECRET@[::1]:5432/app", "postgresql://ada:***@[::1]:5432/app"),
    # Percent-encoded, and raw @ : / ? # & in the password.
    ("postgresql://ada:S%40E%3AC%2FR%3FE%23T%26@db/app", "postgresql://ada:***@db/app"),
    ("postgresql://ada:SE@CRET@db/app", "postgresql://ada:***@db/app"),
    ("postgresql://ada:SE:CRET@db/app", "postgresql://ada:***@db/app"),
    ("postgresql://ada:SE/CRET@db/app", "postgresql://ada:***@db/app"),
    ("postgresql://ada:S@E/C@RET@db/app", "postgresql://ada:***@db/app"),
    ("postgresql://ada:SE//CRET@db/app", "postgresql://ada:***@db/app"),
    ("redis://:SE?CRET@cache/0", "redis://:***@cache/0"),
    ("redis://:SE#CRET@cache/0", "redis://:***@cache/0"),
    ("redis://:SE&CRET@cache/0", "redis://:***@cache/0"),
    ("redis://:SE?=CRET@cache/0?prefix=p", "redis://:***@cache/0?prefix=p"),
    ("redis://:12?CRET@cache/0", "redis://:***@cache/0"),
    ("redis://:SE?CR=ET@cache/0", "redis://:***@cache/0"),
    ("postgresql://ada:SE CRET@db/app", "postgresql://ada:***@db/app"),
    # URLs that do not parse.
    ("postgresql://ada:SECRET@[::1/app", "postgresql://ada:***@[::1/app"),
    ("postgresql://ada:pa%zzSECRET@db/app", "postgresql://ada:***@db/app"),
    ("redis://:SECRET@cache:port/0", "redis://:***@cache:port/0"),
    # Query items whose name holds a secret, in any case, percent-decoded.
    ("postgresql://ada@db/app?password=SECRET", "postgresql://ada@db/app?password=***"),
    (
        "postgresql://db/app?sslmode=require&sslpassword=SECRET&application_name=x",
        "postgresql://db/app?sslmode=require&sslpassword=***&application_name=x",
    ),
    ("postgresql://db/app?PassWord=SECRET", "postgresql://db/app?PassWord=***"),
    ("postgresql://db/app?pass%77ord=SECRET", "postgresql://db/app?pass%77ord=***"),
    ("postgresql://db/app?password=S%26E%23C%3DRET", "postgresql://db/app?password=***"),
    ("postgresql://db/app?password=SE&CRET", "postgresql://db/app?password=***"),
    ("postgresql://db/app?password=SE#CRET", "postgresql://db/app?password=***"),
    ("postgresql://db/app?passwordSECRET", "postgresql://db/app?***"),
    ("postgresql://db/app?passwordSECRET=", "postgresql://db/app?***"),
    ("redis://cache/0?password=SECRET&prefix=p", "redis://cache/0?password=***&prefix=p"),
    ("rediss://cache/0?client_secret=SECRET", "rediss://cache/0?client_secret=***"),
    ("redis://cache/0?token=SECRET", "redis://cache/0?token=***"),
    ("postgresql://ada:SECRET@db/app?password=SECRET", "postgresql://ada:***@db/app?password=***"),
    # libpq's keyword/value form.
    ("host=db password=SECRET port=5432", "host=db password=*** port=5432"),
    ("host=db password = 'SE CRET' port=5432", "host=db password = *** port=5432"),
    ("host=db password='SE\\'CRET'", "host=db password=***"),
    ("host=db password='SECRET", "host=db password=***"),
    ("host=db sslpassword=SECRET", "host=db sslpassword=***"),
    # A message that quotes a URL.
    (
        "cannot connect to postgresql://ada:SECRET@db/app: connection refused",
        "cannot connect to postgresql://ada:***@db/app: connection refused",
    ),
]

UNCHANGED = [
    "postgresql://ada@db:5432/app?sslmode=require",
    "postgresql://db:5432/app?application_name=a@b",
    "postgresql://[::1]:5432/app?application_name=a@b",
    "redis://cache:6379/0?prefix=p",
    "sqlite:///conveyor.db",
    "sqlite:////var/lib/app/a@b.db",
    "memory://tests?inline=true",
    "host=db port=5432 dbname=app",
    "http://127.0.0.1:8000/",
    'connection to server at "127.0.0.1", port 5432 failed: password authentication failed',
    "",
]


@pytest.mark.parametrize(("url", "shown"), SHOWN)
def test_every_secret_a_url_carries_is_shown_as_stars(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize("text", UNCHANGED)
def test_a_text_without_secrets_is_shown_as_it_is(text: str) -> None:
    assert redact_url(text) == text


@given(st.text())
def test_it_never_raises(text: str) -> None:
    assert isinstance(redact_url(text), str)
    assert isinstance(redact_message(text, text), str)


PASSWORDS = st.text(
    alphabet=st.characters(codec="ascii", categories=["L", "N", "P", "S"]), min_size=6
)


FORMS = [
    "postgresql://ada:{}@db.example:5432/app",
    "postgresql://ada@db.example:5432/app?password={}",
    "postgresql://db.example/app?sslmode=require&sslpassword={}&application_name=a@b",
    "redis://:{}@cache.example/0?prefix=p",
    "rediss://default:{}@cache.example:6380/0",
    "unix://:{}@/run/redis.sock",
]


@given(PASSWORDS)
def test_a_percent_encoded_password_is_hidden_wherever_it_is(password: str) -> None:
    encoded = quote(password, safe="")
    for form in FORMS:
        assert redact_url(form.format(encoded)) == form.format("***")


@given(PASSWORDS)
def test_a_raw_password_is_hidden_too(password: str) -> None:
    # Not "a@b?c=d" nor "12?c=d": read as a host, or a port, and a query.
    assume(not re.search(r"[?#][A-Za-z_][\w.%-]*=", password))
    for form in (FORMS[0], FORMS[3], FORMS[4], FORMS[5]):
        assert redact_url(form.format(password)) == form.format("***")


def libpq_refusal(url: str) -> str:
    """What libpq says of a URL it cannot read."""
    with pytest.raises(psycopg.ProgrammingError) as refused:
        conninfo_to_dict(url)
    return str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://ada:pa%zzSECRET@db/app",
        "postgresql://ada@db/app?passwordSECRET",
        "postgresql://ada:SECRET@[::1/app",
        "host=db password='SECRET",
    ],
)
def test_a_drivers_message_about_a_url_shows_none_of_its_secrets(url: str) -> None:
    said = libpq_refusal(url)
    assert "SECRET" in said or "unterminated" in said  # what there is to hide
    assert "SECRET" not in redact_message(said, url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://ada:pa%zzSECRET@db/app",
        "postgresql://ada@db/app?passwordSECRET",
        "postgresql+psycopg://ada:SECRET@db/app",
        "redis+sentinel://:SECRET@s1:26379/m",
        "unix://:SECRET@/run/redis.sock",
        "sqlite://ada:SECRET@db/app.db",
        "host=127.0.0.1 password=SECRET",
        "redis://:SECRET@cache:port/0",
    ],
)
def test_a_url_conveyor_refuses_is_refused_without_its_secret(url: str) -> None:
    with pytest.raises(conveyor.ConfigurationError) as refused:
        backend_from_url(url)
    assert "SECRET" not in str(refused.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://ada@db/app?password=SECRET", "postgresql://ada@db/app?password=***"),
        ("postgresql://ada:S%2FECRET@db/app", "postgresql://ada:***@db/app"),
        ("redis://:SE/CRET@cache:6379/0", "redis://cache:6379/0?prefix=conveyor"),
        ("redis://cache/0?password=SECRET", "redis://cache/0?prefix=conveyor"),
        ("memory://:SECRET@tests", "memory://:***@tests"),
    ],
)
def test_each_backend_shows_its_location_without_secrets(url: str, shown: str) -> None:
    assert backend_from_url(url).location.startswith(shown)
