"""Flask with conveyor: an app factory and a view that enqueues (sync API).

The tasks are defined at module level, so that a worker can import them:
``conveyor worker flask_app:queue``. ``conveyor.App()`` reads the store's URL
from ``CONVEYOR_URL`` (SQLite in ``./conveyor.db`` without it).
"""

from __future__ import annotations

from flask import Flask, request

import conveyor

queue = conveyor.App()


@queue.task(queue="mail")
def send_receipt(order_id: int, email: str) -> str:
    """Email the receipt of one order (a worker runs this)."""
    return f"receipt of order {order_id} sent to {email}"


def create_app() -> Flask:
    app = Flask(__name__)
    app.extensions["conveyor"] = queue

    @app.post("/orders/<int:order_id>/receipt")
    def receipt(order_id: int) -> tuple[dict[str, int], int]:
        body = request.get_json()
        # Durable when enqueue returns; safe from any of the server's threads.
        handle = send_receipt.enqueue(order_id=order_id, email=body["email"])
        return {"task_id": handle.id}, 202

    return app
