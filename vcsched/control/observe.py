"""Need discovery: what a VM needs, estimated from what it uses under its cap (the paper's section 9).

The paper's model takes every VM's CPU need as known; its section 9 names
finding it as the open problem and suggests watching what a VM uses and, when
it uses all it is given, giving it more for a while to see whether it takes it.
This module is that estimate, as pure functions of samples: the sampling (two
CPU-time readings through libvirt) and the probe's cap changes are done by
:mod:`acting.sampling`, which hands the samples here.

**Samples.**  A :class:`Sample` is the cores a VM used over a few seconds
and the cap it had meanwhile.  It is *saturated* when it used its cap, up to
a tolerance (``max(0.01 core, 5 %)`` of the cap: the emulator thread adds
about 0.01 core on top of ``vcpu_quota``, docs/lab.md).  An uncapped VM
saturates at its vCPUs.  A sample below its cap shows the VM's demand; a
saturated one only shows that the demand is *at least* the cap.

**The estimate** (:func:`estimate_need`), over the samples of a sliding
window (`vcsched observe --window`, `vcsched run --window`), from the
previous estimate (the recorded need when there is none):

1. fewer than ``min_samples`` samples: the previous estimate, confidence 0;
2. *not saturated* (the latest sample below its cap, or fewer than
   ``saturated_share`` (half) of the *recent* samples at their cap: the most
   recent half of the window's, and at least ``min_samples`` of them; probe
   samples aside): the ``percentile``-th percentile (default 90) of
   the cores used in the whole window, plus ``headroom`` (10 %) and
   ``margin`` (0.03 core).  The headroom keeps a VM that uses a steady amount
   below its new cap, so it stays unsaturated and the estimate stays put; the
   percentile over the whole window makes lowering wait until the window no
   longer holds the busier past (within one window plus one interval);
3. *saturated*, and the window holds *probe* samples (taken while its cap
   was raised into its host's unused capacity, :func:`probe_caps`): if it used
   less than the probe cap, the probe revealed the demand, estimated as in 2
   from the probe samples; if it used the probe cap too, the need is at least
   that cap: the probe cap plus headroom and margin, or the declared need if
   higher;
4. *saturated below its estimate* (*squeezed*: its cap is its estimate times
   a yield below 1, as planned): that is what the allocation gives it, and it
   says nothing new about the need: the previous estimate;
5. *saturated at its full estimate* and not probed (its host had no capacity
   to spare): the need is at least its cap.  The estimate becomes the cap plus
   headroom and margin (so a VM that keeps using all it is given grows by
   about 10 % per interval), or its *declared* need (what its request or the
   operator recorded) if that is higher: when measurement cannot tell, the
   owner's statement is the best guess there is.

6. *starved*: not at its cap, but its vCPUs waited for a host CPU
   (``vcpu.N.delay`` above ``max(wait_abs, wait_rel * used)``) in
   ``saturated_share`` of the recent samples, or in so many of the window's
   that fewer than ``min_samples`` are left without waiting: what it used is
   *censored* — a lower bound on its need, never the need.  The estimate is
   the previous one (the declared need at first), raised to what the waiting
   samples show it needs at least; it never falls on such evidence.  In rule
   2 samples that waited enter only as that lower bound.

The result is rounded up to 0.01 core, kept between the smallest cap and the
VM's vCPUs, and changed from the previous estimate only when it moves by
more than ``max(0.02 core, 5 %)`` (a dead band, so noise does not re-cap).

**Censored and uncensored evidence.**  A sample in which the VM hit its cap
(used its cap, or was throttled in ``throttled_share`` of its CFS periods) or
waited for a host CPU says "needs at least this"; only the others say "needs
this" (:func:`is_censored`).  An estimate reached by rules 3 (saturated at
the probe), 4, 5 or 6 is *censored* (:attr:`Estimate.censored`): the need may
be higher, so a yield computed with it is an upper bound, and no cap is
lowered on it.  Which signals a host provides is in docs/contention.md; a
host without delay counters cannot show starvation (the limit below).

**Confidence** is the share of the window's samples that bound the need from
both sides (uncensored), scaled down when the window holds fewer than
``full_samples``: 1 for a VM measured below its cap without waiting all
along, 0 for one at its cap or starved throughout (its estimate is then a
lower bound or a carry-over).

**Why half of at least three samples, the latest among them.**  A VM whose
demand is above its cap uses its cap in nearly every sample, give or take a
sample in which the machine itself was busy; one whose demand is below it
fills a sample only when a burst happens to.  Deciding on the latest sample
alone lets a single burst raise a VM to its declared need; requiring every
recent sample at the cap lets one slow sample hide a busy VM.  Two of three
tolerates one of each.  A VM that became busy too recently to fill them is
measured instead (rule 2: its percentile is its cap, so its cap rises by the
headroom), and the next interval sees it saturated: within two intervals
either way.  The samples must each span a sampling period: one over a few
milliseconds reads a capped vCPU's bursts (0 or a whole core), and on the
lab such a sample, taken as an interval began, was the window's latest and
decided at random (:mod:`acting.sampling` no longer takes them).

**Limits.**  An over-committed host (caps summing to its cores, every VM at
its cap) leaves nothing to probe with: a squeezed VM whose demand fell, but
not below its cap, keeps its estimate until it uses less than its cap (or
moves).  A VM that gets less CPU than its cap because the *machine* is busy
(other processes, an over-committed physical host) is told apart only by its
vCPUs' run-queue delay (rule 6); where the host does not report it, such a VM
looks unsaturated and its estimate follows what it actually gets.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vcsched.caps import min_cap, realisable_cap
from vcsched.errors import InputError
from vcsched.inventory import Inventory, VmState, snapshot_hash
from vcsched.plans.ordering import order_steps
from vcsched.plans.plan import Plan
from vcsched.plans.steps import SetCapStep, SetNeedStep
from vcsched.units import CAP_TOLERANCE


@dataclass(frozen=True)
class ObserveParams:
    """The estimator's knobs (module docstring); the defaults are what `vcsched observe` and `run` use."""

    percentile: float = 90.0
    headroom: float = 0.10
    margin: float = 0.03  # cores
    saturation_abs: float = 0.01  # cores: the emulator thread runs outside vcpu_quota
    saturation_rel: float = 0.05
    saturated_share: float = 0.5  # of the recent samples at their cap, for a VM to count as saturated
    min_samples: int = 3
    full_samples: int = 5
    deadband_abs: float = 0.02
    deadband_rel: float = 0.05
    probe_min_raise: float = 0.05  # cores: a smaller raise is not worth a probe
    throttled_share: float = 0.5  # of its CFS periods throttled: the sample hit its cap
    wait_abs: float = 0.02  # cores of run-queue delay a sample may hold and still show demand ...
    wait_rel: float = 0.10  # ... or this share of what it used, whichever is larger

    def __post_init__(self) -> None:
        if not 0 < self.percentile <= 100:
            raise InputError(f"percentile: {self.percentile!r} is not in (0, 100]")
        for name in ("headroom", "margin", "saturation_abs", "saturation_rel", "deadband_abs", "deadband_rel",
                     "probe_min_raise", "wait_abs", "wait_rel"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise InputError(f"{name}: {value!r} is not a finite number >= 0")
        if not 0 < self.throttled_share <= 1:
            raise InputError(f"throttled_share: {self.throttled_share!r} is not in (0, 1]")
        if not 0 < self.saturated_share <= 1:
            raise InputError(f"saturated_share: {self.saturated_share!r} is not in (0, 1]")
        if self.min_samples < 1 or self.full_samples < 1:
            raise InputError("min_samples and full_samples must be at least 1")

    def tolerance(self, cap: float) -> float:
        """How far below its cap a VM still counts as using all of it."""
        return max(self.saturation_abs, self.saturation_rel * cap)


DEFAULT_PARAMS = ObserveParams()


@dataclass(frozen=True)
class Sample:
    """Cores one VM used over ``seconds`` ending at ``time`` (Unix seconds), and the cap it had meanwhile.

    ``cap_cores`` None: uncapped.  ``probe``: taken while a probe had raised
    the cap (:func:`probe_caps`).  ``throttled``: the share of its CFS
    periods in which its own cap throttled it; ``waited_cores``: its vCPUs'
    run-queue delay over the sample, in cores (time runnable but waiting for a
    host CPU per second); None where the host does not provide them
    (docs/contention.md).
    """

    time: float
    seconds: float
    used_cores: float
    cap_cores: float | None
    vcpus: int = 1
    probe: bool = False
    throttled: float | None = None
    waited_cores: float | None = None
    #: Disk bytes/s (read + written) and network bytes/s (the busier direction: a host's ``net_bps`` is per
    #: direction) over the sample; sampled for unmanaged domains only (their I/O is reserved), else None.
    disk_bps: float | None = None
    net_bps: float | None = None

    @property
    def limit(self) -> float:
        """The most it could have used: its cap, or all its vCPUs when uncapped."""
        return float(self.vcpus) if self.cap_cores is None else self.cap_cores


def is_saturated(s: Sample, params: ObserveParams = DEFAULT_PARAMS) -> bool:
    return s.used_cores >= s.limit - params.tolerance(s.limit)


def hit_cap(s: Sample, params: ObserveParams = DEFAULT_PARAMS) -> bool:
    """Its own cap held it back: it used its cap, or was throttled in at least ``throttled_share`` of its periods."""
    return is_saturated(s, params) or (s.throttled is not None and s.throttled >= params.throttled_share - 1e-9)


def waited(s: Sample, params: ObserveParams = DEFAULT_PARAMS) -> bool:
    """Its vCPUs were runnable but waited for a host CPU for more than ``max(wait_abs, wait_rel * used)``."""
    return s.waited_cores is not None and s.waited_cores > max(params.wait_abs, params.wait_rel * s.used_cores)


def is_censored(s: Sample, params: ObserveParams = DEFAULT_PARAMS) -> bool:
    """What it used is only a lower bound on its need ("needs at least this"): it hit its cap or waited."""
    return hit_cap(s, params) or waited(s, params)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


#: How an estimate was reached (module docstring, rules 1-6).
NO_SAMPLES, MEASURED, PROBED, PROBE_SATURATED, SQUEEZED, SATURATED, STARVED = (
    "too few samples", "measured", "probe", "saturated at probe", "squeezed", "saturated", "starved")
#: The bases whose estimate is a lower bound on the need (censored evidence only): a yield computed with it is an
#: upper bound, and no cap is lowered on it.
CENSORED_BASES = frozenset((PROBE_SATURATED, SQUEEZED, SATURATED, STARVED))


@dataclass(frozen=True)
class Estimate:
    """One VM's estimated CPU need, in cores, and how it was reached."""

    vm: str
    host: str
    vcpus: int
    declared: float  # the need recorded in its metadata
    previous: float  # the estimate it started from (the declared need the first time)
    estimate: float  # what to plan with (after the dead band)
    raw: float  # the rules' answer before the dead band
    confidence: float  # 0..1
    saturated: bool
    basis: str
    samples: int
    used_cores: float | None  # the percentile of the cores used over the window
    cap_cores: float | None  # the cap of the latest regular (non-probe) sample
    uncensored: int = 0  # samples that bound the need from both sides (neither at the cap nor waiting)
    throttled: float | None = None  # mean share of throttled CFS periods over the window (None: not measured)
    waited_cores: float | None = None  # mean run-queue delay over the window, in cores (None: not measured)

    @property
    def censored(self) -> bool:
        """The estimate is a lower bound ("needs at least this"): the need may be higher, a yield computed with it
        is an upper bound, and it is never lowered on this evidence."""
        return self.basis in CENSORED_BASES

    @property
    def wants_probe(self) -> bool:
        """At its cap with its full estimate: it may need more, and only a probe can tell."""
        return self.basis in (SATURATED, PROBE_SATURATED)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Estimate:
        """An estimate as :meth:`to_dict` wrote it (a controller's ``observe`` event; older events lack the
        censoring fields: read as uncensored, as their estimator treated them)."""
        def num(key: str) -> float | None:
            return None if d.get(key) is None else float(d[key])

        return cls(str(d["vm"]), str(d["host"]), int(d.get("vcpus", 1)), float(d["declared_need_cores"]),
                   float(d.get("previous_cores", d["declared_need_cores"])), float(d["estimated_need_cores"]),
                   float(d.get("raw_cores", d["estimated_need_cores"])), float(d.get("confidence", 0.0)),
                   bool(d.get("saturated", False)), str(d.get("basis", MEASURED)), int(d.get("samples", 0)),
                   num("used_cores"), num("cap_cores"), int(d.get("uncensored_samples", 0)), num("throttled_share"),
                   num("waited_cores"))

    def to_dict(self) -> dict[str, object]:
        return {"vm": self.vm, "host": self.host, "vcpus": self.vcpus, "declared_need_cores": self.declared,
                "estimated_need_cores": self.estimate, "previous_cores": self.previous, "raw_cores": self.raw,
                "confidence": round(self.confidence, 4), "saturated": self.saturated, "basis": self.basis,
                "samples": self.samples, "used_cores": self.used_cores, "cap_cores": self.cap_cores,
                "censored": self.censored, "uncensored_samples": self.uncensored,
                "throttled_share": None if self.throttled is None else round(self.throttled, 4),
                "waited_cores": None if self.waited_cores is None else round(self.waited_cores, 4)}


def _demand(values: Sequence[float], params: ObserveParams) -> float:
    return percentile(values, params.percentile) * (1 + params.headroom) + params.margin


def estimate_need(vm: VmState, samples: Sequence[Sample], previous: float | None = None,
                  params: ObserveParams = DEFAULT_PARAMS) -> Estimate:
    """The need of managed VM ``vm`` from its window of ``samples`` (oldest first); see the module docstring."""
    if vm.meta is None:
        raise InputError(f"{vm.name}: not managed by vcsched (no recorded need to start from)")
    declared = vm.meta.cpu_need_cores
    prev = declared if previous is None else previous
    n = len(samples)
    regular = [s for s in samples if not s.probe]
    cap_now = regular[-1].cap_cores if regular else vm.cap_cores
    used = percentile([s.used_cores for s in samples], params.percentile) if samples else None
    # Saturated: the latest regular sample at its cap, and saturated_share of the recent ones (the window's most
    # recent half, at least min_samples of them; probe samples, taken at a raised cap, aside): module docstring.
    regular_or_all = regular or list(samples)
    recent = regular_or_all[-max(params.min_samples, (len(regular_or_all) + 1) // 2):]
    saturated = (bool(recent) and is_saturated(recent[-1], params)
                 and sum(is_saturated(s, params) for s in recent) >= params.saturated_share * len(recent) - 1e-9)
    # Censored samples ("needs at least this") and uncensored ones ("needs this") are kept apart: only the
    # latter bound the need from above, so only they count for confidence and only they may lower an estimate.
    uncensored = [s.used_cores for s in samples if not is_censored(s, params)]
    # A sample at its cap enters the percentile at what it used (rule 2: about its cap, the window's top); one in
    # which it waited for a host CPU does not, and only says what the need is at least (rule 6).
    undelayed = [s.used_cores for s in samples if not waited(s, params)]
    floor = max((s.used_cores for s in samples if waited(s, params)), default=None)
    starved = bool(recent) and sum(waited(s, params) for s in recent) >= params.saturated_share * len(recent) - 1e-9
    confidence = (len(uncensored) / n) * min(1.0, n / params.full_samples) if n else 0.0
    throttles = [s.throttled for s in samples if s.throttled is not None]
    waits = [s.waited_cores for s in samples if s.waited_cores is not None]

    def done(raw: float, basis: str) -> Estimate:
        raw = min(max(math.ceil(raw * 100 - 1e-9) / 100, min_cap(vm.vcpus)), float(vm.vcpus))
        moved = abs(raw - prev) > max(params.deadband_abs, params.deadband_rel * prev)
        return Estimate(vm.name, vm.host, vm.vcpus, declared, prev, raw if moved else prev, raw,
                        confidence if basis != NO_SAMPLES else 0.0, saturated, basis, n, used, cap_now,
                        len(uncensored), sum(throttles) / len(throttles) if throttles else None,
                        sum(waits) / len(waits) if waits else None)

    if n < params.min_samples:
        return done(prev, NO_SAMPLES)
    if not saturated:
        if starved or (floor is not None and len(undelayed) < params.min_samples):
            # Rule 6: it got less than its cap because it waited for a host CPU (or too little of the window shows
            # demand): what it used is a lower bound, so the estimate may rise to it and never falls.
            return done(max(prev, _demand([floor], params) if floor is not None else 0.0), STARVED)
        measured = _demand(undelayed, params)
        return done(measured if floor is None else max(measured, _demand([floor], params)), MEASURED)
    probes = [s for s in samples if s.probe]
    if probes:
        if 2 * sum(is_saturated(s, params) for s in probes) < len(probes):
            return done(_demand([s.used_cores for s in probes], params), PROBED)
        lower = max(s.limit for s in probes)
        return done(max(lower * (1 + params.headroom) + params.margin, declared), PROBE_SATURATED)
    limit = float(vm.vcpus) if cap_now is None else cap_now
    if limit < prev - params.tolerance(prev):
        return done(prev, SQUEEZED)
    return done(max(limit * (1 + params.headroom) + params.margin, declared), SATURATED)


def estimate_all(inventory: Inventory, windows: Mapping[str, Sequence[Sample]],
                 previous: Mapping[str, float] | None = None,
                 params: ObserveParams = DEFAULT_PARAMS) -> dict[str, Estimate]:
    """:func:`estimate_need` for every running managed VM of the hosts that answer."""
    previous = previous or {}
    return {v.name: estimate_need(v, windows.get(v.name, ()), previous.get(v.name), params)
            for v in inventory.up().managed()}


# ---------------------------------------------------------------------------------------------- the probe


def probe_caps(inventory: Inventory, estimates: Mapping[str, Estimate],
               params: ObserveParams = DEFAULT_PARAMS) -> dict[str, float]:
    """The raised caps of a probe: VM -> cap, for VMs at their cap with their full estimate (``wants_probe``).

    Cautious: only a host's *unused* capacity is handed out — its cores less
    every managed VM's cap (uncapped ones count with all their vCPUs) — shared
    equally among its VMs that want a probe, never above a VM's vCPUs, on the
    quota grid rounded down.  No other VM's cap changes, so nobody loses CPU
    it was promised, and the host's caps never sum above its cores.  A raise
    below ``probe_min_raise`` is not made.
    """
    out: dict[str, float] = {}
    up = inventory.up()
    for h in up.hosts:
        on = [v for v in up.vms_on(h.name) if v.managed and v.active]
        room = up.usable_cores(h) - sum(v.cap_or_vcpus for v in on)  # unmanaged domains' reservation kept
        wanting = [v for v in on if v.name in estimates and estimates[v.name].wants_probe and v.cap_cores is not None
                   and v.cap_cores < v.vcpus]
        if not wanting or room < params.probe_min_raise:
            continue
        share = room / len(wanting)
        for v in sorted(wanting, key=lambda v: v.name):
            assert v.cap_cores is not None
            cap = realisable_cap(min(float(v.vcpus), v.cap_cores + share), v.vcpus)
            if cap - v.cap_cores >= params.probe_min_raise:
                out[v.name] = cap
    return out


def cap_plan(inventory: Inventory, caps: Mapping[str, float]) -> Plan:
    """A plan of set-cap steps (a probe's raise, or putting caps back), in a safe order."""
    steps = []
    for name, cap in sorted(caps.items()):
        v = inventory.vm(name)
        if v is None:
            raise InputError(f"{name}: not in cluster {inventory.cluster!r}")
        steps.append(SetCapStep(name, v.host, cap))
    now = {h.name: {v.name: v.cap_or_vcpus for v in inventory.vms_on(h.name) if v.managed and v.active}
           for h in inventory.hosts}
    ordered = order_steps(steps, now, {h.name: float(h.cores) for h in inventory.hosts})
    return Plan("adapt", inventory.cluster, snapshot_hash(inventory), 0.0, 0.0, {}, ordered,
                extra={"budget": 0, "migrated_bytes": 0})


def record_plan(inventory: Inventory, estimates: Iterable[Estimate]) -> Plan:
    """`vcsched observe --record`: set-need steps writing each estimate as the VM's recorded need."""
    steps = tuple(SetNeedStep(e.vm, e.host, e.estimate) for e in sorted(estimates, key=lambda e: e.vm)
                  if abs(e.estimate - e.declared) > CAP_TOLERANCE)
    renewing = frozenset(s.vm for s in steps)
    return Plan("adapt", inventory.cluster, snapshot_hash(inventory, renewing=renewing), 0.0, 0.0, {}, steps,
                extra={"budget": 0, "migrated_bytes": 0})
