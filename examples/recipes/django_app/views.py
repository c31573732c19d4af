"""Two ways to enqueue from Django, and the views that use them."""

from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

import conveyor
from django_app.models import Signup
from django_app.tasks import send_welcome


def psycopg_connection(using: str = DEFAULT_DB_ALIAS) -> Any:
    """The psycopg connection under Django's, for ``connection=``.

    Only inside ``transaction.atomic()``: outside it, Django's connection is
    in autocommit mode and the task would commit on its own at once.
    """
    wrapper = connections[using]
    if not wrapper.in_atomic_block:
        raise RuntimeError("enqueue on Django's connection inside transaction.atomic()")
    wrapper.ensure_connection()
    return wrapper.connection


@transaction.atomic
def register(email: str) -> tuple[Signup, conveyor.TaskHandle]:
    """Store the signup and its welcome task in one transaction: both or neither."""
    signup = Signup.objects.create(email=email)
    welcome = send_welcome.options(connection=psycopg_connection())
    return signup, welcome.enqueue(signup_id=signup.pk)


@transaction.atomic
def register_on_commit(email: str) -> Signup:
    """Store the signup; enqueue its welcome task once the transaction has
    committed (a separate write: see the recipe for what that does not cover)."""
    signup = Signup.objects.create(email=email)
    transaction.on_commit(lambda: send_welcome.enqueue(signup_id=signup.pk))
    return signup


@require_POST
def signup(request: HttpRequest) -> JsonResponse:
    try:
        created, handle = register(request.POST["email"])
    except IntegrityError:
        return JsonResponse({"error": "already signed up"}, status=409)
    return JsonResponse({"signup": created.pk, "task": handle.id}, status=201)


@require_POST
def signup_on_commit(request: HttpRequest) -> JsonResponse:
    try:
        created = register_on_commit(request.POST["email"])
    except IntegrityError:
        return JsonResponse({"error": "already signed up"}, status=409)
    return JsonResponse({"signup": created.pk}, status=201)
