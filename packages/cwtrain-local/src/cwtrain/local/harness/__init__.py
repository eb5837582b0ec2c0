"""The local stack's harness: the object store (moto's S3 server) and fault injection.

``objectstore`` (moto's server on a loopback port, and the bucket it serves) and ``faults``
(faults injected into the API, the object store's traffic and the replicas).
"""
