"""The application's own data."""

from django.db import models


class Signup(models.Model):
    email = models.EmailField(unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
