"""Adapters that run one benchmark workload on conveyor and on its Python peers.

One module per system (``conveyor_peer``, ``pgqueuer_peer``,
``procrastinate_peer``, ``chancy_peer``), each a :class:`system.System`;
``benchmarks/peers.py`` drives them one after the other.
"""
