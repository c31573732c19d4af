"""The tasks: run a worker with ``conveyor worker django_app.tasks:queue``.

``conveyor.App()`` reads the store's URL from ``CONVEYOR_URL``: for an
enqueue inside Django's transaction, the database Django uses.
"""

import conveyor

queue = conveyor.App()


@queue.task(queue="mail")
def send_welcome(signup_id: int) -> str:
    """Send the welcome email of one signup (a worker runs this)."""
    return f"welcomed signup {signup_id}"
