"""The cluster file: which hosts vcsched manages, how to reach them, how to boot a default guest.

Format (TOML, written by ``vcsched lab up`` or by hand; docs/files.md)::

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
    address = "10.0.0.12"        # optional: where migrations to this host go (default: the URI's host part)
    storage = "rack1-nfs"        # optional: hosts with the same name share storage (default: the host's name)
    maintenance = true           # optional: cordoned (`vcsched cordon h0`): no new VM, no migration in
    uuid = "6f0c...-..."         # optional: the host's libvirt host UUID (`lab up` writes it): checked at every
                                 # inventory, and what names the cluster lock while the host is down
    fence = {agent = "fence_ipmilan", ip = "10.0.0.112", username = "admin", password = "...", lanplus = 1}
                                 # optional: how to power the host off when it fails (a ClusterLabs fence agent,
                                 # by name on PATH or absolute path; the other keys go to it as options on stdin)

When a host dies (docs/failures.md), all optional::

    failure_timeout = 90         # seconds a host must stay down before it counts as failed (default: 90 s, three
                                 # default controller intervals, and never below host_timeout)
    failures_tolerated = 0       # admission keeps room for this many host failures (0 or 1 ... below the hosts)
    on_failure = "restart"       # "restart": a failed host's VM whose floor the survivors cannot meet still
                                 # restarts, below its floor (docs/failures.md); "strand": it is left down

Across machines (docs/across-machines.md), all optional::

    pki = "/etc/vcsched/pki"     # client certificates (cacert.pem, clientcert.pem, clientkey.pem), added to
                                 # every qemu+tls URI as pkipath
    migration_tls = true         # encrypt migration streams (VIR_MIGRATE_TLS); default false
    host_timeout = 10            # seconds a host may take to answer before it counts as down for the command

Migration throttles (:mod:`vcsched.formats.throttles`), all optional::

    max_migrations = 4           # live migrations in flight in the cluster
    max_migrations_per_host = 1  # in flight on one host, in and out together
    migration_bandwidth = "100MiB"   # per migration, bytes/s (a whole number of MiB/s)
    migration_timeout_per_gib = 60   # seconds per GiB moved, then the migration is aborted

When `vcsched run` may migrate (:mod:`vcsched.formats.windows`), all optional::

    timezone = "Europe/Paris"    # required with windows or blackouts
    windows = ["Mon-Fri 22:00-06:00", "Sat-Sun *"]
    blackouts = ["2026-12-24..2027-01-02 *"]

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

Power saving (:mod:`vcsched.formats.power`, docs/power.md), all optional::

    power_saving = "off"         # "off", "recommend" or "auto"; also min_hosts_on, power_yield, sleep_after,
                                 # wake_time and spare = "consolidate" | "spread"
    # per [[hosts]]: power = {agent = ...} (default: its fence agent), power_saving = false, idle_watts, peak_watts

Parsing is pure: it takes the dict ``tomllib`` decoded (reading the file is
the CLI's job) and raises :class:`InputError` naming the field and the value.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from vcsched.errors import InputError
from vcsched.formats.fields import check_fields, check_fraction, check_name, check_number, check_string
from vcsched.formats.power import (
    CLUSTER_POWER_FIELDS,
    HOST_POWER_FIELDS,
    NO_HOST_POWER,
    NO_POWER,
    HostPower,
    PowerSettings,
    host_power_from_dict,
    power_from_dict,
)
from vcsched.formats.throttles import NO_THROTTLES, THROTTLE_FIELDS, MigrationThrottles, throttles_from_dict
from vcsched.formats.units import parse_size
from vcsched.formats.windows import ALWAYS, WINDOW_FIELDS, MaintenanceSchedule, schedule_from_dict

if TYPE_CHECKING:
    from vcsched.model import Tenant

#: URI schemes of libvirt drivers vcsched knows how to cap (``test`` only for inventory tests; ``sim``: the
#: simulated libvirt of the fault simulation and the scale benchmark, ``sim:///PATH.xml``, never a real host).
KNOWN_URI_SCHEMES = ("qemu", "xen", "libxl", "test", "sim")
DOMAIN_TYPES = ("qemu", "kvm", "xen")

#: Seconds a host may take to answer (open + the inventory's reads) before it counts as down for one command.
DEFAULT_HOST_TIMEOUT_S = 15.0

#: Seconds a host must stay down before the controller counts it failed, when the file does not say: three of
#: ``vcsched run``'s default 30 s intervals, so that one missed reading (or two) is never a failure.
DEFAULT_FAILURE_TIMEOUT_S = 90.0

#: What recovery does with a failed host's VM whose floor (min_yield) the survivors cannot meet: restart it below
#: its floor (the default: a VM that runs slowly beats one that does not run), or leave it stranded.
ON_FAILURE = ("restart", "strand")

#: Fence-agent option names (fence-agents' ``--long-option`` spellings, ``_`` for ``-``) and what vcsched sets
#: itself: the action is vcsched's to choose (off, then status), never the file's.
_FENCE_OPTION = re.compile(r"[a-z][a-z0-9_]{0,63}")
FENCE_RESERVED = frozenset({"action", "agent"})

#: Where migration streams go when the host's URI names no machine (``qemu:///system``, a unix socket):
#: this machine, as before the ``address`` field existed.
LOCAL_ADDRESS = "127.0.0.1"

_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")


def uri_scheme(uri: str) -> str:
    """The driver part of a libvirt URI: ``qemu+unix:///system`` -> ``qemu``."""
    return uri.split(":", 1)[0].split("+", 1)[0] if ":" in uri else ""


def uri_transport(uri: str) -> str:
    """The transport part of a libvirt URI: ``qemu+tls://h/system`` -> ``tls``; none given -> ``""``."""
    head = uri.split(":", 1)[0] if ":" in uri else ""
    return head.split("+", 1)[1] if "+" in head else ""


def uri_host(uri: str) -> str | None:
    """The machine a libvirt URI names (``qemu+tls://10.0.0.2/system`` -> ``10.0.0.2``); None for a local URI."""
    try:
        host = urlsplit(uri).hostname
    except ValueError:
        return None
    return host or None


def check_address(where: str, value: Any) -> str:
    """An IP address (v4 or v6) or a DNS host name: where migration streams to a host are sent."""
    if isinstance(value, str):
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            if _HOSTNAME.fullmatch(value) and not re.fullmatch(r"[0-9.]+", value):
                return value
    raise InputError(f"{where}: {value!r} is not an IP address or host name")


def with_pkipath(uri: str, pki: str | None) -> str:
    """``uri`` with ``pkipath=pki`` added when it is a ``+tls`` URI that does not name its own."""
    if pki is None or uri_transport(uri) != "tls" or "pkipath" in parse_qs(urlsplit(uri).query):
        return uri
    return f"{uri}{'&' if '?' in uri else '?'}pkipath={pki}"


def migration_uri(address: str) -> str:
    """``VIR_MIGRATE_PARAM_URI`` for a destination address (IPv6 in brackets)."""
    try:
        if ipaddress.ip_address(address).version == 6:
            return f"tcp://[{address}]"
    except ValueError:
        pass
    return f"tcp://{address}"


@dataclass(frozen=True)
class GuestDefaults:
    """How to boot a VM whose request names no template: direct kernel + initrd boot."""

    kernel: str
    initrd: str
    cmdline: str = "console=ttyS0 panic=-1 quiet"
    domain_type: str = "qemu"


@dataclass(frozen=True)
class FenceConfig:
    """How to power a failed host off: a ClusterLabs fence agent and the options it reads on stdin.

    ``agent`` is a name looked up on ``PATH`` or an absolute path (checked to be executable when the cluster
    file is loaded, :func:`acting.fence.check_agents`); ``options`` are ``key=value`` lines for it
    (``ip``, ``username``, ``password``, ``plug``, ...), values as text.  ``action`` is vcsched's own.
    """

    agent: str
    options: tuple[tuple[str, str], ...] = ()

    def redacted(self) -> dict[str, str]:
        """The options as a dict with secrets hidden: what a report or an error may show."""
        return {k: ("***" if "pass" in k or "secret" in k or "key" in k else v) for k, v in self.options}


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
    #: Where migrations to this host go (None: the host part of its URI, else this machine).
    address: str | None = None
    #: Hosts with the same storage name share storage; None: the host's own name (nothing shared, the safe
    #: over-estimate of what a move costs).
    storage: str | None = None
    maintenance: bool = False  # cordoned: receives no new VM and no migration (docs/rules.md)
    #: The host's libvirt host UUID as the file declares it (None: not declared): the host must answer with it,
    #: and it names the cluster's lock while the host is down (hypervisor/identity.py).
    uuid: str | None = None
    #: The fence agent that powers it off when it fails (None: never restarted elsewhere automatically).
    fence: FenceConfig | None = None
    #: Power saving (:mod:`vcsched.formats.power`, docs/power.md): its power agent, whether it may sleep, its watts.
    power: HostPower = NO_HOST_POWER

    @property
    def migration_address(self) -> str:
        return self.address or uri_host(self.uri) or LOCAL_ADDRESS

    @property
    def storage_name(self) -> str:
        return self.storage or self.name


@dataclass(frozen=True)
class Cluster:
    name: str
    hosts: tuple[ClusterHost, ...]
    min_yield: float = 0.0
    guest: GuestDefaults | None = None
    coordination: str | None = None  # tooz URL of the cluster lock; None: the default (docs/plans.md)
    policy: str | None = None  # the sharing policy in force (docs/policies.md); None: "yield"
    alpha: float | None = None  # alpha-fair's exponent
    tenants: tuple[Tenant, ...] = ()  # the tenant tree (hdrf); requests name a leaf with tenant = "..."
    lock_ttl: float | None = None  # seconds; None: the default
    pki: str | None = None  # client certificate directory, added to qemu+tls URIs as pkipath
    migration_tls: bool = False  # VIR_MIGRATE_TLS on every migration
    host_timeout: float = DEFAULT_HOST_TIMEOUT_S
    #: Seconds a host must stay down before the controller counts it failed (never below ``host_timeout``).
    failure_timeout: float = DEFAULT_FAILURE_TIMEOUT_S
    #: Host failures admission keeps room for (N+1 with 1): below the number of hosts.
    failures_tolerated: int = 0
    #: What the operator must know about the file (an unverified or unauthenticated URI), one line each.
    warnings: tuple[str, ...] = ()
    #: Live migrations at once, their bandwidth and timeout (:mod:`vcsched.formats.throttles`).
    throttles: MigrationThrottles = NO_THROTTLES
    #: When `vcsched run` may migrate (:mod:`vcsched.formats.windows`); operators' commands are not bound by it.
    schedule: MaintenanceSchedule = ALWAYS
    #: A failed host's VM whose floor the survivors cannot meet: ``restart`` it below its floor (availability
    #: first) or ``strand`` it (its floor first: it stays down until room is made).  :data:`ON_FAILURE`.
    on_failure: str = "restart"
    #: Power saving (:mod:`vcsched.formats.power`, docs/power.md): off, recommend or auto, and its knobs.
    power: PowerSettings = NO_POWER

    def connect_uri(self, host: str) -> str:
        """The URI vcsched opens for ``host``: its URI, with the cluster's ``pki`` for TLS."""
        return with_pkipath(self.host(host).uri, self.pki)

    def shares_storage(self, a: str, b: str) -> bool:
        """Whether a VM's disks on host ``a`` are also reachable on host ``b`` (same ``storage`` name)."""
        return self.host(a).storage_name == self.host(b).storage_name

    @functools.cached_property
    def _by_name(self) -> dict[str, ClusterHost]:
        return {h.name: h for h in self.hosts}

    def host(self, name: str) -> ClusterHost:
        h = self._by_name.get(name)
        if h is not None:
            return h
        raise InputError(f"host {name!r}: not in cluster {self.name!r} (hosts: {', '.join(self.host_names)})")

    @property
    def host_names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    @functools.cached_property
    def cordoned(self) -> frozenset[str]:
        """Hosts in maintenance (computed once: `status` asks for every host)."""
        return frozenset(h.name for h in self.hosts if h.maintenance)


def _host_from_dict(where: str, d: Any) -> ClusterHost:
    d = check_fields(where, d, {"name", "uri", "cores", "memory_reserved", "partition", "disk_bps", "net_bps",
                                "address", "storage", "maintenance", "uuid", "fence"} | HOST_POWER_FIELDS,
                     {"name", "uri"}, kind="table")
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
    address = check_address(f"{where}.address", d["address"]) if "address" in d else None
    storage = check_name(f"{where}.storage", d["storage"]) if "storage" in d else None
    maintenance = d.get("maintenance", False)
    if not isinstance(maintenance, bool):
        raise InputError(f"{where}.maintenance: expected true or false, got {maintenance!r}")
    host_uuid = check_uuid(f"{where}.uuid", d["uuid"]) if "uuid" in d else None
    fence = _fence_from_dict(f"{where}.fence", d["fence"]) if "fence" in d else None
    power = host_power_from_dict(where, d, fence, _fence_from_dict)
    return ClusterHost(name, uri, cores, reserved, partition, rates["disk_bps"], rates["net_bps"], address, storage,
                       maintenance, host_uuid, fence, power=power)


def _fence_from_dict(where: str, d: Any) -> FenceConfig:
    """``fence = {agent = ..., key = value, ...}``: an agent name or absolute path, and scalar options.

    Only the shape is checked here (parsing is pure); that the agent exists and is executable is checked
    when the file is loaded (:func:`acting.fence.check_agents`).
    """
    if not isinstance(d, dict):
        raise InputError(f"{where}: expected a table like {{agent = \"fence_ipmilan\", ip = \"...\"}}, "
                         f"got {d!r}")
    if "agent" not in d:
        raise InputError(f"{where}: missing field 'agent' (a fence agent, e.g. \"fence_ipmilan\")")
    agent = check_string(f"{where}.agent", d["agent"])
    if "\n" in agent or "\0" in agent or ("/" in agent and not agent.startswith("/")):
        raise InputError(f"{where}.agent: {agent!r} is neither a command name nor an absolute path")
    options = []
    for key, value in d.items():
        if key == "agent":
            continue
        if key in FENCE_RESERVED:
            raise InputError(f"{where}.{key}: {value!r}: vcsched sets the fence action itself (off, then status)")
        if not _FENCE_OPTION.fullmatch(key):
            raise InputError(f"{where}: option {key!r} is not a fence-agent option name (lower case, digits, '_')")
        if isinstance(value, bool):
            text = "1" if value else "0"
        elif isinstance(value, int | float | str):
            text = str(value)
        else:
            raise InputError(f"{where}.{key}: {value!r} is not a string, number or true/false")
        if "\n" in text or "\r" in text or "\0" in text:
            raise InputError(f"{where}.{key}: a fence option cannot span lines")
        options.append((key, text))
    return FenceConfig(agent, tuple(options))


def check_uuid(where: str, value: Any) -> str:
    """A UUID (any of the spellings Python's :class:`uuid.UUID` reads), in its canonical lower-case form."""
    try:
        return str(uuid.UUID(check_string(where, value)))
    except ValueError:
        raise InputError(f"{where}: {value!r} is not a UUID (e.g. 6d1b8a52-3f0e-4c59-9a52-8c0f1e0b7a11)") from None


def uri_warnings(where: str, host: str, uri: str) -> tuple[str, ...]:
    """What is unsafe about a host's URI: certificate checks switched off, or no authentication at all.

    Accepted (the operator may have reasons, e.g. a private management
    network) but never silently: each names the host.
    """
    out = []
    if "1" in parse_qs(urlsplit(uri).query).get("no_verify", []):
        out.append(f"{where}.uri: host {host}: no_verify=1 switches off the check of its TLS certificate")
    if uri_transport(uri) == "tcp":
        out.append(f"{where}.uri: host {host}: qemu+tcp is neither encrypted nor authenticated by certificate")
    return tuple(out)


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
    fields = {"name", "min_yield", "guest", "hosts", "coordination", "lock_ttl", "policy", "alpha", "tenants", "pki",
              "migration_tls", "host_timeout", "failure_timeout", "failures_tolerated", "on_failure"}
    d = check_fields("cluster", d, fields | THROTTLE_FIELDS | WINDOW_FIELDS | CLUSTER_POWER_FIELDS, {"name", "hosts"},
                     kind="table")
    name = check_name("name", d["name"])
    hosts_raw = d["hosts"]
    if not isinstance(hosts_raw, list) or not hosts_raw:
        raise InputError("hosts: a cluster needs at least one [[hosts]] table")
    hosts = tuple(_host_from_dict(f"hosts[{i}]", h) for i, h in enumerate(hosts_raw))
    seen: dict[str, int] = {}
    uris: dict[str, int] = {}
    uuids: dict[str, int] = {}
    for i, h in enumerate(hosts):
        if h.name in seen:
            raise InputError(f"hosts[{i}].name: duplicate host name {h.name!r} (also hosts[{seen[h.name]}])")
        # One hypervisor listed twice: every VM on it would be counted (and capped) twice.  The same URI is caught
        # here; other spellings of one host, by its UUID at every inventory (hypervisor/identity.py).
        if h.uri in uris:
            raise InputError(f"hosts[{i}].uri: {h.uri!r} is also hosts[{uris[h.uri]}]'s URI")
        if h.uuid is not None and h.uuid in uuids:
            raise InputError(f"hosts[{i}].uuid: {h.uuid} is also hosts[{uuids[h.uuid]}]'s: list each host once")
        seen[h.name] = i
        uris[h.uri] = i
        if h.uuid is not None:
            uuids[h.uuid] = i
    min_yield = check_fraction("min_yield", d.get("min_yield", 0.0))
    guest = _guest_from_dict(d["guest"]) if "guest" in d else None
    coordination = check_coordination_url("coordination", d["coordination"]) if "coordination" in d else None
    policy, alpha = _policy_from_dict(d)
    tenants = _tenants_from_dict(d["tenants"]) if "tenants" in d else ()
    lock_ttl = check_number("lock_ttl", d["lock_ttl"], low=1.0, low_open=False) if "lock_ttl" in d else None
    pki = check_string("pki", d["pki"]) if "pki" in d else None
    if pki is not None and (not pki.startswith("/") or any(c in pki for c in "&?#\n")):
        raise InputError(f"pki: {pki!r} is not an absolute directory path (without '&', '?', '#')")
    migration_tls = d.get("migration_tls", False)
    if not isinstance(migration_tls, bool):
        raise InputError(f"migration_tls: {migration_tls!r} is not true or false")
    host_timeout = DEFAULT_HOST_TIMEOUT_S
    if "host_timeout" in d:
        raw = d["host_timeout"]
        if isinstance(raw, float) and math.isnan(raw):
            raise InputError(f"host_timeout: {raw!r} is not a number of seconds above 0")
        host_timeout = check_number("host_timeout", raw, low=0.0)
    failure_timeout = max(DEFAULT_FAILURE_TIMEOUT_S, host_timeout)
    if "failure_timeout" in d:
        failure_timeout = check_number("failure_timeout", d["failure_timeout"], low=0.0)
        if failure_timeout < host_timeout:
            raise InputError(f"failure_timeout: {d['failure_timeout']!r} is below host_timeout ({host_timeout:g} s): "
                             "a host must have missed at least one whole reading before it counts as failed")
    failures_tolerated = d.get("failures_tolerated", 0)
    if isinstance(failures_tolerated, bool) or not isinstance(failures_tolerated, int) or failures_tolerated < 0:
        raise InputError(f"failures_tolerated: {failures_tolerated!r} is not a whole number >= 0")
    if failures_tolerated >= len(hosts):
        raise InputError(f"failures_tolerated: {failures_tolerated!r} is not below the number of hosts "
                         f"({len(hosts)}): some host must survive to take the VMs")
    on_failure = d.get("on_failure", "restart")
    if on_failure not in ON_FAILURE:
        raise InputError(f"on_failure: {on_failure!r} is not one of {', '.join(map(repr, ON_FAILURE))}")
    warnings = tuple(w for i, h in enumerate(hosts) for w in uri_warnings(f"hosts[{i}]", h.name, h.uri))
    return Cluster(name, hosts, min_yield, guest, coordination, policy, alpha, tenants, lock_ttl, pki,
                   migration_tls, host_timeout, failure_timeout, failures_tolerated, warnings,
                   throttles_from_dict(d), schedule_from_dict(d), on_failure, power=power_from_dict(d, len(hosts)))


def _policy_from_dict(d: Any) -> tuple[str | None, float | None]:
    """``policy`` (a registered sharing policy) and ``alpha`` (only for alpha-fair, in its range)."""
    if "policy" not in d:
        if "alpha" in d:
            raise InputError(f"alpha: {d['alpha']!r} given without policy = \"alpha-fair\"")
        return None, None
    # Lazy, like the tenants below: every command reads the cluster file, and the policies (numpy) are needed only
    # when it names one; apply, repair, cordon and lab start 0.2-0.3 s faster without them (tests/test_inputs.py).
    from vcsched.policies.allocation import PolicyOptions
    from vcsched.policies.registry import check_options, get  # lazy: numpy

    policy = get(check_string("policy", d["policy"])).name
    alpha = d.get("alpha")
    check_options(get(policy), PolicyOptions(alpha=alpha))
    return policy, None if alpha is None else float(alpha)


def _tenants_from_dict(raw: Any) -> tuple[Tenant, ...]:
    """``[[tenants]]``: unique names, weights above 0, parents that exist, no cycle (one line each)."""
    if not isinstance(raw, list):
        raise InputError(f"tenants: expected a list of [[tenants]] tables, got {type(raw).__name__}")
    # Lazy: the tenant tree's model and checks bring numpy (see _policy_from_dict).
    from vcsched.formats.instance import parse_tenant
    from vcsched.model import Instance  # lazy: numpy
    from vcsched.validate import check_instance  # lazy: numpy

    tenants = tuple(parse_tenant(f"tenants[{i}]", t) for i, t in enumerate(raw))
    for i, t in enumerate(tenants):
        check_name(f"tenants[{i}].name", t.name)
    check_instance(Instance((), (), tenants))
    return tenants


#: tooz backends vcsched is tested against; the others tooz knows are accepted as untested (docs/plans.md).
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
