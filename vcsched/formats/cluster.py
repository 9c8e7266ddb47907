"""The cluster file: which hosts vcsched manages, how to reach them, how to boot a default guest.

Format (TOML, written by ``vcsched lab up`` or by hand; docs/operations.md)::

    name = "lab"                 # cluster name
    min_yield = 0.0              # optional floor on the whole cluster's minimum yield
    coordination = "etcd3+http://10.0.0.5:2379"   # optional: where the cluster lock lives (tooz URL)
    lock_ttl = 10                # optional: seconds a dead holder keeps the lock (etcd lease)
    [guest]                      # optional default guest boot for requests without a template
    kernel = "/path/vmlinuz"
    initrd = "/path/initrd.gz"
    cmdline = "console=ttyS0 panic=-1 quiet"
    domain_type = "qemu"
    [[hosts]]
    name = "h0"
    uri = "qemu+unix:///system?socket=/path/libvirt-sock"
    cores = 1                    # optional: usable cores (default: what libvirt reports)
    memory_reserved = "64MiB"    # optional: memory kept for the host itself
    partition = "/vcl1h0"        # optional libvirt <resource><partition> for VMs placed here
    disk_bps = "200MiB"          # optional: disk bytes per second the host can give its VMs together
    net_bps = "117MiB"           # optional: network bytes per second, in each direction
    maintenance = true           # optional: cordoned (`vcsched cordon h0`): no new VM, no migration in

Sharing policies (docs/policies.md), all optional::

    policy = "drf"               # the policy place/adapt/status use (a --policy flag overrides it)
    alpha = 2.0                  # the exponent of policy "alpha-fair" (only with it)
    [[tenants]]                  # the tenant tree of policy "hdrf": organisations, requests name a leaf
    name = "org"
    weight = 1.0
    [[tenants]]
    name = "ads"
    weight = 3.0
    parent = "org"

Parsing is pure: it takes the dict ``tomllib`` decoded (reading the file is
the CLI's job) and raises :class:`InputError` naming the field and the value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vcsched.errors import InputError
from vcsched.formats.fields import check_fields, check_fraction, check_name, check_number, check_string
from vcsched.formats.units import parse_size

if TYPE_CHECKING:
    from vcsched.model import Tenant

#: URI schemes of libvirt drivers vcsched knows how to cap (``test`` only for inventory tests).
KNOWN_URI_SCHEMES = ("qemu", "xen", "libxl", "test")
DOMAIN_TYPES = ("qemu", "kvm", "xen")

def uri_scheme(uri: str) -> str:
    """The driver part of a libvirt URI: ``qemu+unix:///system`` -> ``qemu``."""
    return uri.split(":", 1)[0].split("+", 1)[0] if ":" in uri else ""


@dataclass(frozen=True)
class GuestDefaults:
    """How to boot a VM whose request names no template: direct kernel + initrd boot."""

    kernel: str
    initrd: str
    cmdline: str = "console=ttyS0 panic=-1 quiet"
    domain_type: str = "qemu"


@dataclass(frozen=True)
class ClusterHost:
    name: str
    uri: str
    cores: int | None = None
    memory_reserved: int = 0
    partition: str | None = None
    #: Bytes per second of disk I/O / network (each direction) the host can give its VMs together; libvirt
    #: cannot know them (``vcsched calibrate --resource disk|net`` measures them).  None: not declared:
    #: capacity 0 in the multi-resource model (nothing needing that resource is placed there), and
    #: vcsched refuses to cap that resource on the host.
    disk_bps: int | None = None
    net_bps: int | None = None
    maintenance: bool = False  # cordoned: receives no new VM and no migration (docs/rules.md)


@dataclass(frozen=True)
class Cluster:
    name: str
    hosts: tuple[ClusterHost, ...]
    min_yield: float = 0.0
    guest: GuestDefaults | None = None
    coordination: str | None = None  # tooz URL of the cluster lock; None: the default (docs/operations.md)
    policy: str | None = None  # the sharing policy in force (docs/policies.md); None: "yield"
    alpha: float | None = None  # alpha-fair's exponent
    tenants: tuple[Tenant, ...] = ()  # the tenant tree (hdrf); requests name a leaf with tenant = "..."
    lock_ttl: float | None = None  # seconds; None: the default

    def host(self, name: str) -> ClusterHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise InputError(f"host {name!r}: not in cluster {self.name!r} (hosts: {', '.join(self.host_names)})")

    @property
    def host_names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    @property
    def cordoned(self) -> frozenset[str]:
        """Hosts in maintenance."""
        return frozenset(h.name for h in self.hosts if h.maintenance)


def _host_from_dict(where: str, d: Any) -> ClusterHost:
    d = check_fields(where, d, {"name", "uri", "cores", "memory_reserved", "partition", "disk_bps", "net_bps",
                                "maintenance"}, {"name", "uri"}, kind="table")
    name = check_name(f"{where}.name", d["name"])
    uri = check_string(f"{where}.uri", d["uri"])
    scheme = uri_scheme(uri)
    if scheme not in KNOWN_URI_SCHEMES:
        raise InputError(f"{where}.uri: {uri!r} has unknown scheme {scheme or '(none)'!r} "
                         f"(known: {', '.join(KNOWN_URI_SCHEMES)})")
    cores = d.get("cores")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise InputError(f"{where}.cores: {cores!r} is not a whole number of cores >= 1")
    reserved = parse_size(f"{where}.memory_reserved", d.get("memory_reserved", 0), allow_zero=True)
    partition = d.get("partition")
    if partition is not None and (not isinstance(partition, str) or not re.fullmatch(r"(/[A-Za-z0-9_.-]+)+",
                                                                                         partition)):
        raise InputError(f"{where}.partition: {partition!r} is not a partition path like \"/machine\"")
    rates = {k: parse_size(f"{where}.{k}", d[k]) if k in d else None for k in ("disk_bps", "net_bps")}
    maintenance = d.get("maintenance", False)
    if not isinstance(maintenance, bool):
        raise InputError(f"{where}.maintenance: expected true or false, got {maintenance!r}")
    return ClusterHost(name, uri, cores, reserved, partition, rates["disk_bps"], rates["net_bps"], maintenance)


def _guest_from_dict(d: Any) -> GuestDefaults:
    d = check_fields("guest", d, {"kernel", "initrd", "cmdline", "domain_type"}, {"kernel", "initrd"}, kind="table")
    domain_type = d.get("domain_type", "qemu")
    if domain_type not in DOMAIN_TYPES:
        raise InputError(f"guest.domain_type: {domain_type!r} is not one of {', '.join(DOMAIN_TYPES)}")
    cmdline = d.get("cmdline", GuestDefaults.cmdline)
    if not isinstance(cmdline, str):
        raise InputError(f"guest.cmdline: expected a string, got {cmdline!r}")
    return GuestDefaults(check_string("guest.kernel", d["kernel"]), check_string("guest.initrd", d["initrd"]),
                         cmdline, domain_type)


def cluster_from_dict(d: Any) -> Cluster:
    """Validate a decoded cluster file; every error names the field and the value."""
    d = check_fields("cluster", d, {"name", "min_yield", "guest", "hosts", "coordination", "lock_ttl", "policy",
                                    "alpha", "tenants"}, {"name", "hosts"}, kind="table")
    name = check_name("name", d["name"])
    hosts_raw = d["hosts"]
    if not isinstance(hosts_raw, list) or not hosts_raw:
        raise InputError("hosts: a cluster needs at least one [[hosts]] table")
    hosts = tuple(_host_from_dict(f"hosts[{i}]", h) for i, h in enumerate(hosts_raw))
    seen: dict[str, int] = {}
    uris: dict[str, int] = {}
    for i, h in enumerate(hosts):
        if h.name in seen:
            raise InputError(f"hosts[{i}].name: duplicate host name {h.name!r} (also hosts[{seen[h.name]}])")
        if h.uri in uris:  # one hypervisor listed twice: every VM on it would be counted (and capped) twice
            raise InputError(f"hosts[{i}].uri: {h.uri!r} is also hosts[{uris[h.uri]}]'s URI")
        seen[h.name] = i
        uris[h.uri] = i
    min_yield = check_fraction("min_yield", d.get("min_yield", 0.0))
    guest = _guest_from_dict(d["guest"]) if "guest" in d else None
    coordination = check_coordination_url("coordination", d["coordination"]) if "coordination" in d else None
    policy, alpha = _policy_from_dict(d)
    tenants = _tenants_from_dict(d["tenants"]) if "tenants" in d else ()
    lock_ttl = check_number("lock_ttl", d["lock_ttl"], low=1.0, low_open=False) if "lock_ttl" in d else None
    return Cluster(name, hosts, min_yield, guest, coordination, policy, alpha, tenants, lock_ttl)


def _policy_from_dict(d: Any) -> tuple[str | None, float | None]:
    """``policy`` (a registered sharing policy) and ``alpha`` (only for alpha-fair, in its range)."""
    if "policy" not in d:
        if "alpha" in d:
            raise InputError(f"alpha: {d['alpha']!r} given without policy = \"alpha-fair\"")
        return None, None
    from vcsched.policies.allocation import PolicyOptions
    from vcsched.policies.registry import check_options, get

    policy = get(check_string("policy", d["policy"])).name
    alpha = d.get("alpha")
    check_options(get(policy), PolicyOptions(alpha=alpha))
    return policy, None if alpha is None else float(alpha)


def _tenants_from_dict(raw: Any) -> tuple[Tenant, ...]:
    """``[[tenants]]``: unique names, weights above 0, parents that exist, no cycle (one line each)."""
    from vcsched.formats.instance import check_instance, parse_tenant
    from vcsched.model import Instance

    if not isinstance(raw, list):
        raise InputError(f"tenants: expected a list of [[tenants]] tables, got {type(raw).__name__}")
    tenants = tuple(parse_tenant(f"tenants[{i}]", t) for i, t in enumerate(raw))
    for i, t in enumerate(tenants):
        check_name(f"tenants[{i}].name", t.name)
    check_instance(Instance((), (), tenants))
    return tenants


#: tooz backends vcsched is tested against; the others tooz knows are accepted as untested (docs/operations.md).
TESTED_COORDINATION = ("file", "etcd3+http", "etcd3+https")
UNTESTED_COORDINATION = ("zookeeper", "kazoo", "redis", "memcached", "mysql", "postgresql", "consul", "kubernetes")


def check_coordination_url(where: str, url: Any) -> str:
    """A tooz backend URL (the cluster lock's home); an unknown scheme is bad input naming it."""
    text = check_string(where, url)
    scheme, sep, rest = text.partition("://")
    if not sep or (scheme not in TESTED_COORDINATION and scheme not in UNTESTED_COORDINATION):
        raise InputError(f"{where}: {text!r} has no known coordination scheme (use file:///DIR, "
                         "etcd3+http://HOST:2379 or etcd3+https://HOST:2379)")
    if scheme == "file" and not rest.strip("/"):
        raise InputError(f"{where}: {text!r} names no directory (e.g. file:///var/lib/vcsched/coordination)")
    return text
