"""Adapters that run one benchmark workload on conveyor and on its Python peers.

One module per system, each a :class:`system.System`. On PostgreSQL
(``benchmarks/peers.py``): ``conveyor_peer``, ``pgqueuer_peer``,
``procrastinate_peer``, ``chancy_peer``. On Redis (``benchmarks/redis_peers.py``,
each a :class:`redis_system.RedisSystem`): ``conveyor_redis_peer``,
``saq_peer``, ``arq_peer``, ``dramatiq_peer``, ``taskiq_peer``, ``rq_peer``,
``celery_peer``. The driver runs them one after the other.
"""
