"""Settings of the example project: PostgreSQL through psycopg 3.

The connection comes from libpq's environment (``PGHOST``, ``PGUSER``,
``PGPASSWORD``...); the tasks go to the same database, in the schema
``CONVEYOR_SCHEMA`` names (default ``conveyor``).
"""

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "insecure-example-key")
DEBUG = False
ALLOWED_HOSTS = ["localhost", "testserver"]
INSTALLED_APPS = ["django_app"]
ROOT_URLCONF = "django_app.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        # psycopg 3: conveyor takes the psycopg connection under Django's.
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("PGDATABASE", "app"),
    }
}
