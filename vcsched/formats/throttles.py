"""Migration throttles: how many live migrations may run at once, how fast, and for how long (cluster file).

All optional, top-level keys of the cluster file (docs/migrations.md, *Migration throttles*)::

    max_migrations = 4               # live migrations in flight in the whole cluster
    max_migrations_per_host = 1      # in flight on one host, arriving and leaving counted together
    migration_bandwidth = "100MiB"   # bytes per second one migration may use (libvirt's bandwidth, MiB/s)
    migration_timeout_per_gib = 60   # seconds per GiB a migration moves; past that it is aborted

*Why these four.*  A re-balancer that starts every migration of a wave at once
can saturate the migration network or a host's NIC and CPU (KubeVirt's
``parallelMigrationsPerCluster`` / ``parallelOutboundMigrationsPerNode``,
oVirt's per-host limits), and a migration that never converges (a guest
dirtying memory faster than the link) holds both hosts' memory for ever; the
per-GiB timeout is KubeVirt's ``completionTimeoutPerGiB``.

A migration counts on both of its hosts: a host's limit caps what arrives
and what leaves together, since both use its NIC and memory bandwidth.

libvirt takes the bandwidth in whole MiB/s (``VIR_MIGRATE_PARAM_BANDWIDTH``);
a rate that is not a whole number of MiB/s is refused naming both readings,
as a VM's memory is (:func:`vcsched.formats.units.check_vm_memory`), not
rounded behind the operator's back.

Pure: parsing takes the decoded TOML table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vcsched.errors import InputError
from vcsched.formats.fields import check_number
from vcsched.formats.units import format_size, parse_size
from vcsched.units import GIB, MIB

#: The cluster file's keys this module reads.
THROTTLE_FIELDS = frozenset({"max_migrations", "max_migrations_per_host", "migration_bandwidth",
                             "migration_timeout_per_gib"})


@dataclass(frozen=True)
class MigrationThrottles:
    """The cluster's migration limits; None: no limit of that kind."""

    max_migrations: int | None = None
    max_migrations_per_host: int | None = None
    bandwidth: int | None = None  # bytes per second, a whole number of MiB/s
    timeout_per_gib: float | None = None  # seconds per GiB moved

    @property
    def bandwidth_mib(self) -> int | None:
        """The bandwidth as libvirt takes it (MiB/s), None for no limit."""
        return None if self.bandwidth is None else self.bandwidth // MIB

    def timeout_for(self, moved_bytes: int) -> float | None:
        """Seconds a migration of ``moved_bytes`` may take before it is aborted; None: no timeout."""
        if self.timeout_per_gib is None:
            return None
        return self.timeout_per_gib * max(moved_bytes, 1) / GIB

    def limits_concurrency(self) -> bool:
        return self.max_migrations is not None or self.max_migrations_per_host is not None

    def to_dict(self) -> dict[str, Any]:
        return {"max_migrations": self.max_migrations, "max_migrations_per_host": self.max_migrations_per_host,
                "migration_bandwidth": self.bandwidth, "migration_timeout_per_gib": self.timeout_per_gib}


NO_THROTTLES = MigrationThrottles()


def _count(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{where}: {value!r} is not a whole number of migrations >= 1")
    return value


def _bandwidth(where: str, value: Any) -> int:
    n = parse_size(where, value)
    if n % MIB:
        raise InputError(f"{where}: {value!r} is {n} bytes/s, not a whole number of MiB/s, which is what libvirt "
                         f"takes (KB, MB, GB are powers of 1000, KiB, MiB, GiB of 1024): write it in MiB, e.g. "
                         f"\"{max(1, n // MIB)}MiB\"" + (f" ({format_size(n)}/s)" if n >= MIB else ""))
    return n


def throttles_from_dict(d: Mapping[str, Any]) -> MigrationThrottles:
    """The throttle keys of a decoded cluster file (the others are the cluster parser's); errors name key and value."""
    return MigrationThrottles(
        _count("max_migrations", d["max_migrations"]) if "max_migrations" in d else None,
        _count("max_migrations_per_host", d["max_migrations_per_host"]) if "max_migrations_per_host" in d else None,
        _bandwidth("migration_bandwidth", d["migration_bandwidth"]) if "migration_bandwidth" in d else None,
        check_number("migration_timeout_per_gib", d["migration_timeout_per_gib"])
        if "migration_timeout_per_gib" in d else None,
    )
