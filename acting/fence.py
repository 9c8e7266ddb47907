"""Fencing: powering a failed host off through a ClusterLabs fence agent before its VMs run elsewhere.

A host that stopped answering may only be cut off (a hung libvirtd, a dead
management network) while its guests still run and write to shared disks;
restarting them elsewhere would then make two writers.  So nothing of a
failed host is restarted until a fence agent has switched it off *and* says
it is off.

**The interface** is the one of the ``fence-agents`` package (Debian's
``fence-agents``, the agents Pacemaker runs): the agent is started with no
arguments and reads its options as ``key=value`` lines on stdin, ``action``
among them.  It answers by exit code:

* ``action=off``: 0 when the host is off (already off counts), anything else
  is a failure;
* ``action=status``: 0 when the host is *on*, 2 when it is *off*, anything else
  (1: generic error, 3: login denied, 4: connection lost, 5: timed out, ...)
  means the agent could not tell — treated as "not known to be off";
* ``action=monitor``: 0 when the fence device answers.

vcsched runs ``off`` and then ``status``, and a host counts as fenced only
when ``off`` exited 0 and ``status`` exited 2.  Every run has a timeout; an
agent that outlives it is killed with its whole process group.  Options are
never shown in errors with their values when they look secret
(:meth:`vcsched.formats.cluster.FenceConfig.redacted`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vcsched.errors import InputError, VcschedError
from vcsched.formats.cluster import Cluster, ClusterHost, FenceConfig

#: Seconds one agent run may take (fence_ipmilan's own power_timeout is 20 s, plus login and retries).
DEFAULT_AGENT_TIMEOUT_S = 60.0

#: ``action=status`` exit codes (fence-agents' lib/fencing.py).
STATUS_ON = 0
STATUS_OFF = 2


class FenceError(VcschedError):
    """Fencing failed or could not confirm the host is off: nothing of the host is restarted (exit 1)."""

    exit_code = 1


def resolve_agent(where: str, agent: str) -> str:
    """The agent's absolute path: a name found on ``PATH`` (plus /usr/sbin and /sbin, where Debian installs
    the agents) or an absolute path to an executable file; else :class:`InputError` naming it."""
    if agent.startswith("/"):
        path = Path(agent)
        if not path.is_file():
            raise InputError(f"{where}: fence agent {agent!r} does not exist")
        if not os.access(path, os.X_OK):
            raise InputError(f"{where}: fence agent {agent!r} is not executable")
        return agent
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    found = shutil.which(agent, path=search)
    if found is None:
        raise InputError(f"{where}: unknown fence agent {agent!r} (not on PATH, /usr/sbin or /sbin; "
                         "install fence-agents or give an absolute path)")
    return found


def check_agents(cluster: Cluster) -> None:
    """Every host's fence agent exists and is executable (part of loading the cluster file: exit 2)."""
    for i, h in enumerate(cluster.hosts):
        if h.fence is not None:
            resolve_agent(f"hosts[{i}].fence.agent", h.fence.agent)


def agent_input(fence: FenceConfig, action: str) -> str:
    """The stdin of one run: the options as ``key=value`` lines, then ``action``."""
    return "".join(f"{k}={v}\n" for k, v in fence.options) + f"action={action}\n"


@dataclass(frozen=True)
class AgentRun:
    """One run of a fence agent: its action, exit code (None: killed at the timeout) and output."""

    action: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    def said(self) -> str:
        """The agent's last words (stderr first: where fence-agents log their errors), one line."""
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return text[-1][:300] if text else "no output"


def run_agent(fence: FenceConfig, action: str, timeout_s: float = DEFAULT_AGENT_TIMEOUT_S) -> AgentRun:
    """Run the agent once with ``action``; never raises for the agent's own failure (the caller judges)."""
    path = resolve_agent("fence.agent", fence.agent)
    start = time.monotonic()
    try:
        proc = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    except OSError as exc:
        raise FenceError(f"fence agent {fence.agent}: cannot run it: {exc}") from None
    try:
        out, err = proc.communicate(agent_input(fence, action), timeout=timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    return AgentRun(action, code, out or "", err or "", time.monotonic() - start)


@dataclass(frozen=True)
class FenceResult:
    """What fencing one host did: ``fenced`` only when ``off`` succeeded and ``status`` then said off."""

    host: str
    agent: str
    fenced: bool
    detail: str
    seconds: float

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "agent": self.agent, "fenced": self.fenced, "detail": self.detail,
                "seconds": round(self.seconds, 3)}


def _failed(run: AgentRun, timeout_s: float) -> str:
    if run.returncode is None:
        return f"action={run.action} did not finish within {timeout_s:g} s (killed)"
    return f"action={run.action} exited {run.returncode}: {run.said()}"


def run_state(run: AgentRun) -> str:
    """``"on" | "off" | "unknown"`` from an ``action=status`` run's exit code (module docstring)."""
    return {STATUS_ON: "on", STATUS_OFF: "off"}.get(run.returncode if run.returncode is not None else -1, "unknown")


def power_status(fence: FenceConfig, timeout_s: float = DEFAULT_AGENT_TIMEOUT_S) -> tuple[str, AgentRun]:
    """``("on" | "off" | "unknown", run)`` from ``action=status``'s exit code (module docstring)."""
    run = run_agent(fence, "status", timeout_s)
    return run_state(run), run


def switch_off(host: str, agent: str, run: Callable[[str], AgentRun],
               timeout_s: float = DEFAULT_AGENT_TIMEOUT_S, clock: Callable[[], float] = time.monotonic) -> FenceResult:
    """``off``, then ``status``, through ``run`` (one agent run of the action it is given): ``fenced`` only when
    ``off`` exited 0 and ``status`` then said off.  The one place both fencing and power saving's power-off
    (acting/power.py) judge an agent.  ``clock`` times it: the caller's, so that a power-off under a simulated
    clock reports simulated seconds (the machine's own made a replay's trace differ with the machine's load)."""
    start = clock()
    off = run("off")
    if off.returncode != 0:
        return FenceResult(host, agent, False, f"host {host}: fence agent {agent}: {_failed(off, timeout_s)}",
                           clock() - start)
    status = run("status")
    state = run_state(status)
    if state != "off":
        why = "still on" if state == "on" else f"status unknown ({_failed(status, timeout_s)})"
        return FenceResult(host, agent, False, f"host {host}: fence agent {agent}: off exited 0 but the host is "
                           f"{why}", clock() - start)
    return FenceResult(host, agent, True, f"host {host} is off (fence agent {agent}: off, then status off)",
                       clock() - start)


def fence_host(host: ClusterHost, timeout_s: float = DEFAULT_AGENT_TIMEOUT_S) -> FenceResult:
    """Power ``host`` off with its agent, then confirm with ``status``; a :class:`FenceResult` either way.

    A host without an agent is never fenced (``fenced`` False, said why): vcsched cannot know its guests
    stopped, so none of them may run elsewhere.
    """
    if host.fence is None:
        return FenceResult(host.name, "", False, f"host {host.name} has no fence agent (cluster file: "
                           "fence = {agent = ...}): its VMs may still run there", 0.0)
    fence = host.fence
    return switch_off(host.name, fence.agent, lambda action: run_agent(fence, action, timeout_s), timeout_s)
