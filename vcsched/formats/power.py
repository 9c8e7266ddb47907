"""The cluster file's power-saving fields (docs/power.md): which hosts may sleep, how, and what they draw.

Cluster level, all optional::

    power_saving = "off"         # "off" (default), "recommend" (propose sleeps and wakes) or "auto"
    min_hosts_on = 1             # never fewer hosts on than this (default 1, at least 1)
    power_yield = 1.0            # the yield every VM must keep with a host asleep (default 1.0: no VM slowed)
    sleep_after = "40m"          # the sleep condition must hold this long first (default 40 min, vSphere DPM's)
    wake_time = "10m"            # what a host is assumed to take to wake until one wake was measured
    spare = "consolidate"        # room left once every floor and the target yield hold: "consolidate"
                                 # (empty hosts, for sleeping) or "spread" (even the hosts' free room);
                                 # unset with power_saving = "off": adapt leaves the room as it is
    sleep_margin = 0.3           # a host sleeps only if the others have room for 30 % more CPU demand ...
    wake_margin = 0.1            # ... and one wakes once the hosts on lack room for 10 % more (below sleep_margin)
    wake_test_every = "7d"       # wake a host asleep this long and put it back: it still wakes (default: never)

Per host, all optional::

    power = {agent = "fence_ipmilan", ip = "10.0.0.112", username = "admin", password = "..."}
                                 # the agent that powers it off and on (the fence syntax; default: its fence agent)
    power_saving = false         # this host never sleeps
    idle_watts = 95              # what it draws on and idle ...
    peak_watts = 310             # ... and fully busy (linear between: energy accounting)

Parsing is pure, like the rest of the cluster file's (:mod:`vcsched.formats.cluster`): it takes decoded
TOML and raises :class:`InputError` naming the field and the value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vcsched.errors import InputError
from vcsched.formats.duration import parse_duration
from vcsched.formats.fields import check_fraction, check_number

if TYPE_CHECKING:
    from vcsched.formats.cluster import FenceConfig

#: ``power_saving`` values: never, propose (recommend/approve), act.
POWER_MODES = ("off", "recommend", "auto")
#: ``spare`` values: what the room above the floors and the target yield is used for.
SPARE_MODES = ("consolidate", "spread")

#: vSphere DPM decides power-off over a 40-minute history: the default time the sleep condition must hold.
DEFAULT_SLEEP_AFTER_S = 2400.0
#: Assumed until a host's wake was measured: generous, so that wakes are early rather than late.
DEFAULT_WAKE_TIME_S = 600.0

CLUSTER_POWER_FIELDS = frozenset({"power_saving", "min_hosts_on", "power_yield", "sleep_after", "wake_time",
                                  "spare", "sleep_margin", "wake_margin", "wake_test_every"})
#: The band between them is the hysteresis that keeps a host from sleeping and waking on every fluctuation, and
#: wakes a host while the room still holds (as vSphere DPM's band from 45 % to 81 % utilisation does).
DEFAULT_SLEEP_MARGIN, DEFAULT_WAKE_MARGIN = 0.3, 0.1
HOST_POWER_FIELDS = frozenset({"power", "power_saving", "idle_watts", "peak_watts"})


@dataclass(frozen=True)
class PowerSettings:
    """The cluster's power-saving settings (module docstring)."""

    mode: str = "off"
    min_hosts_on: int = 1
    target_yield: float = 1.0
    sleep_after: float = DEFAULT_SLEEP_AFTER_S
    wake_time: float = DEFAULT_WAKE_TIME_S
    spare: str = "consolidate"
    #: Extra CPU demand (a fraction) the hosts left on must have room for before a host sleeps ...
    sleep_margin: float = DEFAULT_SLEEP_MARGIN
    #: ... and below which a host wakes (``wake_margin < sleep_margin``: the hysteresis band).
    wake_margin: float = DEFAULT_WAKE_MARGIN
    #: Whether the file sets ``spare`` (else it is the default, which applies only with power saving on).
    spare_given: bool = False
    #: Seconds a host may sleep before the controller wakes it and puts it back, to prove it still wakes (a host
    #: that fails to wake is better found by a test than by the demand that needed it); None: never.
    wake_test_every: float | None = None

    @property
    def spare_goal(self) -> str | None:
        """What ``adapt`` does with the room above the floors and the target yield: ``spare`` when the file sets
        it or power saving is on; else None, the room left as it is (clusters that never asked for either keep
        the adaptation they had)."""
        return self.spare if self.spare_given or self.mode != "off" else None


@dataclass(frozen=True)
class HostPower:
    """One host's power settings: ``agent`` (its ``power`` agent, else its ``fence`` agent; None: neither, so it
    cannot be powered on or off), whether it may sleep at all, and its idle and peak draw in watts (None: not
    declared, so no energy is counted for it)."""

    agent: FenceConfig | None = None
    saving: bool = True
    idle_watts: float | None = None
    peak_watts: float | None = None


NO_POWER = PowerSettings()
NO_HOST_POWER = HostPower()


def _choice(where: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise InputError(f"{where}: {value!r} is not one of {', '.join(repr(a) for a in allowed)}")
    return value


def power_from_dict(d: Any, n_hosts: int) -> PowerSettings:
    """The cluster-level fields of a decoded cluster file (unknown fields are the caller's to refuse)."""
    mode = _choice("power_saving", d.get("power_saving", "off"), POWER_MODES)
    min_on = d.get("min_hosts_on", 1)
    if isinstance(min_on, bool) or not isinstance(min_on, int) or min_on < 1:
        raise InputError(f"min_hosts_on: {min_on!r} is not a whole number >= 1")
    if min_on > n_hosts:
        raise InputError(f"min_hosts_on: {min_on!r} is above the number of hosts ({n_hosts})")
    target = check_fraction("power_yield", d["power_yield"], low_open=True) if "power_yield" in d else 1.0
    sleep_after = (parse_duration("sleep_after", d["sleep_after"], allow_zero=True) if "sleep_after" in d
                   else DEFAULT_SLEEP_AFTER_S)
    wake_time = parse_duration("wake_time", d["wake_time"]) if "wake_time" in d else DEFAULT_WAKE_TIME_S
    spare = _choice("spare", d.get("spare", "consolidate"), SPARE_MODES)
    sleep_margin = (check_number("sleep_margin", d["sleep_margin"], low_open=False) if "sleep_margin" in d
                    else DEFAULT_SLEEP_MARGIN)
    wake_margin = (check_number("wake_margin", d["wake_margin"], low_open=False) if "wake_margin" in d
                   else DEFAULT_WAKE_MARGIN)
    if wake_margin >= sleep_margin:
        which = "wake_margin" if "wake_margin" in d else "sleep_margin"
        raise InputError(f"{which}: {d.get(which, wake_margin)!r}: wake_margin ({wake_margin:g}) must be below "
                         f"sleep_margin ({sleep_margin:g}), else a host could sleep and wake at once")
    wake_test = parse_duration("wake_test_every", d["wake_test_every"]) if "wake_test_every" in d else None
    if wake_test is not None and wake_test < wake_time:
        raise InputError(f"wake_test_every: {d['wake_test_every']!r} is shorter than wake_time ({wake_time:g} s): "
                         "a host would be tested again before it could have woken")
    return PowerSettings(mode, min_on, target, sleep_after, wake_time, spare, sleep_margin, wake_margin,
                         "spare" in d, wake_test)


def host_power_from_dict(where: str, d: Any, fence: FenceConfig | None,
                         agent_from_dict: Callable[[str, Any], FenceConfig]) -> HostPower:
    """A ``[[hosts]]`` table's power fields; ``agent_from_dict`` parses ``power`` exactly as ``fence`` is parsed."""
    agent = agent_from_dict(f"{where}.power", d["power"]) if "power" in d else fence
    saving = d.get("power_saving", True)
    if not isinstance(saving, bool):
        raise InputError(f"{where}.power_saving: {saving!r} is not true or false (false: this host never sleeps)")
    idle = check_number(f"{where}.idle_watts", d["idle_watts"], low_open=False) if "idle_watts" in d else None
    peak = check_number(f"{where}.peak_watts", d["peak_watts"], low_open=False) if "peak_watts" in d else None
    if (idle is None) != (peak is None):
        given = "idle_watts" if idle is not None else "peak_watts"
        raise InputError(f"{where}.{given}: {d[given]!r} given alone: declare both idle_watts and peak_watts")
    if idle is not None and peak is not None and idle > peak:
        raise InputError(f"{where}.idle_watts: {d['idle_watts']!r} is above peak_watts ({d['peak_watts']!r})")
    return HostPower(agent, saving, idle, peak)
