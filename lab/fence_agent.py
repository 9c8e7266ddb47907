"""The lab's fence agent: powers a lab host "off" the way a power cut would, behind the ClusterLabs interface.

``vcsched lab up`` writes an executable ``fence_vcsched_lab`` into the lab
directory (:func:`install`) and names it in each host's ``fence`` table of the
cluster file, so that vcsched's fencing (:mod:`acting.fence`) runs the very
same path against the lab as against ``fence_ipmilan`` in production.

It reads ``key=value`` lines on stdin like every agent of the fence-agents
package (blank lines and ``#`` comments skipped, ``-`` and ``_`` alike in
names, unknown options ignored with a warning) and knows:

* ``plug``: the lab host (``h1``); ``lab_dir``: the lab's directory;
* ``action=off``: SIGKILL every process in that host's mount namespace — its
  ``libvirtd``, ``virtlogd`` and QEMU processes, nothing else: no guest is shut
  down cleanly and nothing is written, as with the power gone — then wait
  until none is left; exit 0 once off (already off too);
* ``action=status``: ``Status: ON`` and exit 0 while any such process is
  left, ``Status: OFF`` and exit 2 once none is;
* ``action=monitor``: exit 0 when the lab directory exists;
* ``action=list``: one ``plug,alias`` line per lab host;
* ``action=metadata``: the agent's description as XML;
* ``action=on``: bring the host back as ``vcsched lab up`` repairs a host
  whose daemons died: its daemons restarted in a fresh namespace, with its
  identity (name, host UUID) and the lab's migration port block; exit 0 once
  libvirt answers there (already on too).  Holds the lab's lock, so it never
  interleaves with ``lab up`` or ``lab down``.  A fault for tests of failed
  wakes: while ``<lab_dir>/hN/power-on-fails`` exists (:func:`power_on_fault`),
  ``on`` fails for that host (exit 1, the file's text in its ``Failed:``
  line), as a BMC that does not answer would;
* ``action=reboot``: refused (exit 1): vcsched never asks for it.

Exit 1 with a ``Failed: ...`` line on stderr for anything else, as the
fence-agents do.  Processes are found from the lab directory alone (the host's
bind mounts, :func:`lab.daemons.namespace_holders`), never by name.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from hypervisor.files import write_atomic

AGENT_NAME = "fence_vcsched_lab"
EXIT_OK, EXIT_ERROR, EXIT_STATUS_OFF = 0, 1, 2

#: Seconds ``off`` waits for the killed processes to be gone (a killed QEMU is reaped by init, sometimes late).
OFF_WAIT_S = 20.0

METADATA = f"""<?xml version="1.0" ?>
<resource-agent name="{AGENT_NAME}" shortdesc="Fence agent for the hosts of a vcsched lab">
<longdesc>Powers a lab host off as a power cut would: SIGKILL of every process in its mount namespace
(libvirtd, virtlogd, QEMU), and on again: its daemons restarted in a fresh namespace with its identity.
Status is on while any of them is left.</longdesc>
<parameters>
\t<parameter name="action" unique="0" required="1">
\t\t<getopt mixed="-o, --action=[action]" />
\t\t<content type="string" default="off" />
\t\t<shortdesc lang="en">Fencing action</shortdesc>
\t</parameter>
\t<parameter name="plug" unique="0" required="1">
\t\t<getopt mixed="-n, --plug=[host]" />
\t\t<content type="string" />
\t\t<shortdesc lang="en">The lab host (h0, h1, ...)</shortdesc>
\t</parameter>
\t<parameter name="lab_dir" unique="0" required="1">
\t\t<getopt mixed="--lab-dir=[dir]" />
\t\t<content type="string" />
\t\t<shortdesc lang="en">The lab's directory</shortdesc>
\t</parameter>
</parameters>
<actions>
\t<action name="off" />
\t<action name="status" />
\t<action name="monitor" />
\t<action name="list" />
\t<action name="metadata" />
</actions>
</resource-agent>
"""

KNOWN = ("action", "plug", "lab_dir", "port", "nodename")


def parse_stdin(text: str) -> dict[str, str]:
    """``key=value`` lines as fence-agents read them (``port`` and ``nodename`` are other names of ``plug``)."""
    options: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition("=")
        name = name.strip().replace("-", "_")
        value = re.sub(r'^"(.*)"$', r"\1", value.strip())
        if name == "option":  # the interface's older name of action
            name = "action"
        if name not in KNOWN:
            print(f"WARNING: Parse error: Ignoring unknown option '{line}'", file=sys.stderr)
            continue
        if name in ("port", "nodename"):
            name = "plug"
        options[name] = value
    return options


def _fail(message: str) -> int:
    print(f"Failed: {message}", file=sys.stderr)
    return EXIT_ERROR


def _host(options: dict[str, str]) -> tuple[object, int] | str:
    """``(layout, index)`` of the host the options name, or why not."""
    from lab.state import LabLayout

    if "lab_dir" not in options:
        return "missing option lab_dir"
    root = Path(options["lab_dir"])
    if not root.is_dir():
        return f"lab_dir {options['lab_dir']!r} is not a directory"
    plug = options.get("plug", "")
    if not re.fullmatch(r"h[0-9]+", plug):
        return f"plug {plug!r} is not a lab host (h0, h1, ...)"
    layout = LabLayout(root)
    index = int(plug[1:])
    if not layout.host_dir(index).is_dir():
        return f"plug {plug!r}: no such host in lab {root}"
    return layout, index


def _left(layout: object, index: int) -> list[int]:
    from lab.daemons import namespace_holders
    from lab.state import LabLayout, pid_gone

    assert isinstance(layout, LabLayout)
    return [p for p in namespace_holders(layout, index) if not pid_gone(p)]


def main(stdin: str | None = None) -> int:
    options = parse_stdin(sys.stdin.read() if stdin is None else stdin)
    action = options.get("action", "off")
    if action == "metadata":
        print(METADATA, end="")
        return EXIT_OK
    if action == "list":
        root = Path(options.get("lab_dir", ""))
        if not root.is_dir():
            return _fail(f"lab_dir {options.get('lab_dir', '')!r} is not a directory")
        for p in sorted(root.iterdir()):
            if p.is_dir() and re.fullmatch(r"h[0-9]+", p.name):
                print(f"{p.name},{p.name}")
        return EXIT_OK
    if action == "monitor":
        return EXIT_OK if Path(options.get("lab_dir", "")).is_dir() else _fail("lab_dir is not a directory")
    found = _host(options)
    if isinstance(found, str):
        return _fail(found)
    layout, index = found
    if action == "status":
        on = bool(_left(layout, index))
        print(f"Status: {'ON' if on else 'OFF'}")
        return EXIT_OK if on else EXIT_STATUS_OFF
    if action == "off":
        from lab.daemons import kill_namespace
        from lab.state import LabLayout

        assert isinstance(layout, LabLayout)
        deadline = time.monotonic() + OFF_WAIT_S
        while True:
            kill_namespace(layout, index, timeout_s=max(deadline - time.monotonic(), 0.1))
            if not _left(layout, index):
                print("Success: Powered OFF")
                return EXIT_OK
            if time.monotonic() > deadline:
                return _fail(f"processes of lab host h{index} survived SIGKILL: {_left(layout, index)}")
            time.sleep(0.1)
    if action == "on":
        return _power_on(layout, index)
    if action == "reboot":
        return _fail("action reboot: not supported (off, then on)")
    return _fail(f"unknown action {action!r} (off, on, status, monitor, list, metadata)")


#: The file whose presence makes ``on`` fail for its host (module docstring).
POWER_ON_FAULT = "power-on-fails"


def power_on_fault(host_dir: Path) -> Path:
    """The fault file of the lab host whose directory is ``host_dir`` (``LabLayout.host_dir``): while it exists,
    ``on`` fails for that host."""
    return host_dir / POWER_ON_FAULT


def _power_on(layout: object, index: int) -> int:
    """``on`` (module docstring): what ``lab up`` does for one host whose daemons died, under the lab's lock."""
    # The lab's own helpers, private to it: the recorded shape and block, its lock, the liveness of a port claim.
    from lab import _claim_live, _exclusive, _recorded_block, _recorded_shape, cgroups, daemons, ports
    from lab.state import LabLayout
    from vcsched.errors import VcschedError

    assert isinstance(layout, LabLayout)
    fault = power_on_fault(layout.host_dir(index))
    if fault.exists():
        return _fail(f"lab host h{index}: {fault.read_text().strip() or 'power on refused'} (lab fault: {fault})")
    recorded = _recorded_block(layout)
    if recorded is None:
        return _fail(f"lab {layout.root} records no migration port block: run 'vcsched lab up' to repair it")
    transport, shared = _recorded_shape(layout)
    try:
        with _exclusive(layout):
            if daemons.daemon_pid(layout, index, "libvirtd") is not None and daemons.answers(layout.uri(index)):
                print("Success: Already ON")
                return EXIT_OK
            block = ports.claim_block(layout.root, recorded, _claim_live)
            if block != recorded:
                return _fail(f"the lab's migration port block {recorded} is held by another lab (got {block})")
            cgroups.create_partition(layout.partition(index))  # idempotent: a reboot may have removed it
            daemons.repair_host(layout, index, block=block, tls=transport == "tls", shared=shared)
    except (VcschedError, OSError) as e:
        return _fail(f"lab host h{index}: {e}")
    print("Success: Powered ON")
    return EXIT_OK


def script_text(python: str, repo: str) -> str:
    """The executable installed into a lab directory: this module's :func:`main` under ``python``."""
    return (f"#!{python}\n"
            f'"""{AGENT_NAME}: the vcsched lab\'s fence agent (lab/fence_agent.py)."""\n'
            "import sys\n"
            f"sys.path.insert(0, {repo!r})\n"
            "from lab.fence_agent import main\n"
            "sys.exit(main())\n")


def install(root: Path) -> Path:
    """Write ``<root>/fence_vcsched_lab`` (mode 0755) and return its path."""
    path = root / AGENT_NAME
    repo = str(Path(__file__).resolve().parents[2])
    write_atomic(path, script_text(sys.executable, repo), mode=0o755)  # never a half-written agent on PATH
    return path
