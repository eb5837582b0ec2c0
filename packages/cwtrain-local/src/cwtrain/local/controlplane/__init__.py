"""The control-plane stand-in: the v1alpha1 inference API on loopback.

``server`` (the HTTP front, routes and errors in the service's shape), ``state`` (deployments,
gateways, hot-loads and replicas, and their state machines), ``records``, ``resources`` (ids,
validation, times), ``pages`` (page tokens) and ``supervisor`` (the replica processes a
deployment runs, and the hot-loads they carry out).
"""
