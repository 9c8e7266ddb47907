"""Built-in workloads: the papers' configurations and vcsched's own.

Bonald & Roberts ("Enhanced Cluster Computing Performance through
Proportional Fairness", §3.3–3.4) use one pool of two resources, CPU and
"RAM", and jobs with per-task profiles ``a_k``.  RAM there scales with the
number of tasks, so it maps to a vcsched *fluid* resource, named ``io`` here,
not to vcsched's rigid memory (docs/simulate.md).  Each class is one VM
whose need is ``a_k / max_j a_kj`` on one host of capacity 1: its yield is
its dominant share, ``φ_k = y_k / max_j a_kj``, and with ``max_j a_kj = 1``
in every profile here ``μ = 1`` means work of mean 1 at full speed.

The rates given here only fix the *mix* (``λ_1 = λ_2``, or ``λ_1 = 3 λ_2``);
:meth:`Workload.scaled_to_load` sets the load of the most loaded resource
(CPU in every configuration of the paper: their x-axis).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vcsched.errors import InputError
from vcsched.model import Tenant
from vcsched.simulate.workload import HostSpec, Part, Phase, VCClass, Work, Workload, validate


def one_part(needs: dict[str, float]) -> tuple[Phase, ...]:
    return (Phase((Part(tuple(sorted(needs.items())), 1.0),)),)


def profile_class(name: str, a: Sequence[float], rate: float, *, work: Work | None = None,
                  permanent: int = 0) -> VCClass:
    """A Bonald & Roberts class: profile ``a = (cpu, io)``, one VM of need ``a / max(a)``."""
    top = max(a)
    needs = {"cpu": a[0] / top, "io": a[1] / top}
    return VCClass(name, rate, one_part(needs), work=work or Work(), permanent=permanent)


def br_pool() -> tuple[HostSpec, ...]:
    return (HostSpec("pool", cpu=1.0, memory=1.0, capacity=(("io", 1.0),)),)


def br(profiles: Sequence[Sequence[float]], mix: Sequence[float]) -> Workload:
    """Bonald & Roberts' classes with rates in proportion ``mix``, at load 0.5 unless ``--load`` says otherwise."""
    classes = tuple(profile_class(f"class{k + 1}", a, m) for k, (a, m) in enumerate(zip(profiles, mix, strict=True)))
    return validate(Workload(br_pool(), classes)).scaled_to_load(0.5)


FIG1 = ((1.0, 0.1), (0.1, 1.0))
FIG2 = ((1.0, 0.1), (0.5, 1.0))
FIG3 = ((1.0, 0.1), (1.0, 0.5), (0.5, 1.0), (0.1, 1.0))


def single_resource() -> Workload:
    """Two classes on one resource (different mean sizes): processor sharing, ``γ = 1 − ρ`` for every class."""
    return validate(Workload((HostSpec("pool", cpu=1.0, memory=1.0),), (
        VCClass("small", 1.0, one_part({"cpu": 1.0}), work=Work(0.5)),
        VCClass("large", 1.0, one_part({"cpu": 1.0}), work=Work(2.0)),
    )))


def strategy_proofness(alpha: float = 0.1, beta: float | None = None) -> Workload:
    """§3.4: one permanent class-1 job ``a_1 = (1, α)``, claiming ``(1, β)`` if ``beta``; class 2 ``(α, 1)``."""
    claim = alpha if beta is None else beta
    return validate(Workload(br_pool(), (
        profile_class("class1", (1.0, claim), 0.0, permanent=1),
        profile_class("class2", (alpha, 1.0), 0.5),  # ρ2 = 0.5 unless --load says otherwise
    )))


def phased() -> Workload:
    """VCs whose work has parts of different lengths in parallel: where CARBYNE's leftover comes from.

    ``etl``: a CPU-heavy transform beside a short I/O-heavy load, then a
    barrier, then an I/O-heavy write.  ``query``: a short CPU scan beside a long
    network shuffle.  ``batch``: one part (nothing to give).  One host of
    capacity 1 in every resource: the papers' single pool.
    """
    etl = (Phase((Part((("cpu", 0.8), ("io", 0.1)), 0.5), Part((("cpu", 0.1), ("io", 0.6)), 0.15))),
           Phase((Part((("cpu", 0.1), ("io", 0.9)), 0.35),)))
    query = (Phase((Part((("cpu", 0.6), ("net", 0.1)), 0.2), Part((("cpu", 0.1), ("net", 0.8)), 0.8))),)
    return validate(Workload(
        (HostSpec("pool", cpu=1.0, memory=1.0, capacity=(("io", 1.0), ("net", 1.0))),),
        (VCClass("etl", 1.0, etl, work=Work(1.0)),
         VCClass("query", 1.0, query, work=Work(0.5)),
         VCClass("batch", 1.0, one_part({"cpu": 0.5, "io": 0.5, "net": 0.2}), work=Work(0.5))),
    ))


def cluster64() -> Workload:
    """vcsched's own: 64 hosts with CPU, disk and network, and four kinds of virtual clusters.

    Memory per VM is rigid (a quarter of the hosts' memory is used on
    average at the default load); weights 2 for the interactive ``web`` VCs and
    tenants for H-DRF (``prod``: web and db; ``research``: ml and batch).
    """
    hosts = (HostSpec("h", cpu=1.0, memory=1.0, capacity=(("disk", 1.0), ("net", 1.0)), count=64),)
    return validate(Workload(hosts, (
        VCClass("web", 4.0, one_part({"cpu": 0.3, "disk": 0.05, "net": 0.4}), vms=4, memory=0.05,
                work=Work(1.0), weight=2.0, tenant="prod"),
        VCClass("db", 2.0, one_part({"cpu": 0.2, "disk": 0.7, "net": 0.1}), vms=2, memory=0.15,
                work=Work(2.0), tenant="prod"),
        VCClass("ml", 1.0, one_part({"cpu": 0.9, "disk": 0.1, "net": 0.2}), vms=8, memory=0.1,
                work=Work(3.0, "erlang", 4), tenant="research"),
        VCClass("batch", 4.0, one_part({"cpu": 0.6, "disk": 0.3, "net": 0.05}), vms=1, memory=0.1,
                work=Work(1.0, "det"), tenant="research"),
    ), (Tenant("prod", 1.0), Tenant("research", 1.0))))


SCENARIOS: dict[str, tuple[Callable[[], Workload], str]] = {
    "br-fig1a": (lambda: br(FIG1, (1, 1)), "Bonald & Roberts Fig. 1a: a1=(1,1/10), a2=(1/10,1), balanced load"),
    "br-fig1b": (lambda: br(FIG1, (3, 1)), "Fig. 1b: the same, unbalanced λ1 = 3 λ2"),
    "br-fig2a": (lambda: br(FIG2, (1, 1)), "Fig. 2a: a1=(1,1/10), a2=(1/2,1), balanced"),
    "br-fig2b": (lambda: br(FIG2, (3, 1)), "Fig. 2b: the same, unbalanced"),
    "br-fig3a": (lambda: br(FIG3, (1, 1, 1, 1)), "Fig. 3a: four classes, ρ1 = ρ2 = ρ3 = ρ4"),
    "br-fig3b": (lambda: br(FIG3, (3, 3, 1, 1)), "Fig. 3b: four classes, ρ1 = ρ2 = 3ρ3 = 3ρ4"),
    "single": (single_resource, "one resource, two classes of different sizes: processor sharing"),
    "br-lie": (strategy_proofness, "§3.4: a permanent class-1 job (1, 1/10) against class-2 arrivals (1/10, 1)"),
    "br-lie-n1": (lambda: strategy_proofness(0.1, 1 / 1.9), "§3.4: the same job claiming β = 1/(1 + 0.9 n), n = 1"),
    "br-lie-n2": (lambda: strategy_proofness(0.1, 1 / 2.8), "§3.4: the same job claiming β optimal for n = 2"),
    "br-lie-n5": (lambda: strategy_proofness(0.1, 1 / 5.5), "§3.4: the same job claiming β optimal for n = 5"),
    "phased": (phased, "VCs with parallel parts and phases, for altruism (CARBYNE)"),
    "cluster64": (cluster64, "64 hosts (cpu, disk, net), four kinds of multi-VM VCs, weights and tenants"),
}


def scenario(name: str) -> Workload:
    if name not in SCENARIOS:
        raise InputError(f"scenario: unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
    return SCENARIOS[name][0]()
