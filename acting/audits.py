"""Where the audits of applied plans live: beside the recommendations, on the cluster's coordination backend.

``file://DIR``: ``DIR/audits-KEY.json``; ``etcd3+http(s)://HOST:PORT``: the key ``/vcsched/audits/KEY`` — the
same mechanism, locking and compare-and-swap as the recommendations book (:class:`acting.recommendations.
SharedDocument`), so `vcsched audit` on any machine reads what the leading controller recorded, and a new
leader appends to the same log.  The log and its records are pure (:mod:`vcsched.control.audit`).
"""

from __future__ import annotations

from acting.recommendations import SharedDocument
from vcsched.control.audit import AuditLog


class AuditStore(SharedDocument[AuditLog]):
    """The audit log of one cluster (``key``: the cluster lock's) on the coordination backend ``url``."""

    def __init__(self, url: str, key: str, *, timeout: float = 5.0) -> None:
        super().__init__(url, key, "audits", AuditLog.from_dict, AuditLog.to_dict, AuditLog, timeout=timeout)
