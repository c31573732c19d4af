"""A Django app that enqueues conveyor tasks when users sign up.

Two ways, in ``views.py``: inside the request's own transaction (the task
is stored only if that transaction commits), and from
``transaction.on_commit`` (the task is stored after the commit, or never).
"""
