"""The scale rows of ``vcsched bench``: ``status``, ``place`` and ``headroom`` on 1,000 fake hosts of libvirt's
test driver and of the simulated libvirt, with Ganeti's ``hspace`` on the same clusters when it is installed.

Each host is a ``test:///DIR/hN.xml`` file (:mod:`hypervisor.testhosts`):
an independent host with no daemon and no network, so the rows measure
vcsched's own cost per host and per VM.  Two measurements per command:

* the whole process, as an operator waits for it (interpreter start-up,
  imports, reading the hosts, planning, printing): wall time and the CPU
  time (user + system) the process used, median of REPEAT runs after one
  untimed run;
* the libvirt calls it makes per host, counted by running the command once
  in this process (:func:`hypervisor.connections.calls_made`).

``hspace`` (Debian's ``ganeti-htools``, a yardstick for the measurement, not a
dependency) reads the same cluster written in Ganeti's text format
(:func:`ganeti_text`: the same nodes, memory and instances) and answers the
same question as ``vcsched headroom`` for the memory-bound shape.
"""

from __future__ import annotations

import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vcsched.errors import VcschedError
from vcsched.experiments import OnProgress

#: The row of the test driver's own cost: every host opened and closed, in-process, without vcsched.
OPENS_ROW = "test driver alone: open + close"
#: The row of the simulated libvirt's own cost: every host's node file read, in-process, without vcsched.
SIM_ROW = "simulated libvirt alone: read the node files"
HARNESS_ROWS = (OPENS_ROW, SIM_ROW)
#: The issue's scale: 1,000 hosts, 10,000 VMs; the target of status and place (seconds).
SCALE_HOSTS, SCALE_VMS_PER_HOST, TARGET_S = 1000, 10, 1.0
#: The shape the headroom rows ask about (memory binds: 6 more per host of the scale cluster) and the targets.
HEADROOM_SHAPE, HEADROOM_MEMORY_MIB = "cpu_cores=0.25,memory=4GiB", 4096
TARGETS = {"status": TARGET_S, "place": TARGET_S, "headroom": 2.0, "headroom --failures 1": 5.0}
HSPACE_ROW = "hspace -t (Ganeti), same cluster and shape"
HSPACE_DISK_MIB = 1024  # each instance's disk in the Ganeti text file (ganeti_text)
#: One hspace run is stopped after this long (it took >= 2 h at 1,000 nodes): the row then says so.
HSPACE_TIMEOUT_S = 300.0


def target_of(command: str) -> float | None:
    """A row's target in seconds (None: a harness or yardstick row): the longest command name it starts with."""
    hits = [name for name in TARGETS if command == name or command.startswith(name + " ")]
    return TARGETS[max(hits, key=len)] if hits and command not in HARNESS_ROWS else None


@dataclass(frozen=True)
class ScaleRow:
    command: str
    hosts: int
    vms: int
    wall_s: tuple[float, ...]
    cpu_s: tuple[float, ...]
    calls_per_host: tuple[int, int]  # (fewest, most) libvirt calls on one host, the open included
    #: Set when a run did not finish: the row's times are then its bound, not a measurement.
    unfinished: str = ""

    @property
    def wall_median(self) -> float:
        return statistics.median(self.wall_s)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_s)


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _whole(argv: Sequence[str], repeat: int, timeout: float | None = None,
           expect: int = 0) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Wall and CPU seconds of ``repeat`` runs after an untimed one, each exiting ``expect``; a run longer than
    ``timeout`` is killed and raises :class:`subprocess.TimeoutExpired`."""
    walls, cpus = [], []
    for i in range(repeat + 1):
        cpu0, start = _child_cpu(), time.perf_counter()
        done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, check=False, timeout=timeout)
        took, cpu = time.perf_counter() - start, _child_cpu() - cpu0
        if done.returncode != expect:
            last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise VcschedError(f"{' '.join(argv)} exited with status {done.returncode}: {last}")
        if i:  # run 0 warms the page cache
            walls.append(took)
            cpus.append(cpu)
    return tuple(walls), tuple(cpus)


def _calls(args: Sequence[str], hosts: int, expect: int = 0) -> tuple[int, int]:
    from click.testing import CliRunner

    from cli.main import cli
    from hypervisor.connections import calls_made

    before = calls_made()
    result = CliRunner().invoke(cli, list(args))
    if result.exit_code != expect:
        raise VcschedError(f"vcsched {' '.join(args)} exited with status {result.exit_code}: {result.output[-300:]}")
    after = calls_made()
    per = [after[f"h{i}"] - before[f"h{i}"] for i in range(hosts)]
    return min(per), max(per)


def time_opens(cluster_file: Path, hosts: int, repeat: int) -> tuple[float, ...]:
    """Seconds to open (and close) every host's ``test:///`` connection, one after the other, in this process
    and without vcsched: what libvirt's test driver itself costs (it parses the file and starts each domain on
    every open), apart from anything vcsched does."""
    import libvirt

    uris = [f"test://{cluster_file.parent / f'h{h}.xml'}" for h in range(hosts)]
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for uri in uris:
            libvirt.open(uri).close()
        runs.append(time.perf_counter() - start)
    return tuple(runs)


def time_loads(cluster_file: Path, hosts: int, repeat: int) -> tuple[float, ...]:
    """CPU seconds to read every host's node file into the simulated libvirt (:func:`hypervisor.simlibvirt.
    load_node`), in this process and without vcsched: what the simulated hosts themselves cost."""
    from hypervisor.simlibvirt import SimWorld, load_node

    runs = []
    for _ in range(repeat):
        world, start = SimWorld(), time.process_time()
        for h in range(hosts):
            path = str(cluster_file.parent / f"h{h}.xml")
            load_node(world, path, path)
        runs.append(time.process_time() - start)
    return tuple(runs)


def time_scale(vcsched: Sequence[str], repeat: int, on_progress: OnProgress | None = None, *,
               hosts: int = SCALE_HOSTS, vms_per_host: int = SCALE_VMS_PER_HOST) -> list[ScaleRow]:
    """``status --sample 0 --json`` and ``place REQUEST --json`` (a dry run) on ``hosts`` hosts of libvirt's
    test driver, then on the same hosts served by the simulated libvirt (``sim://``, :mod:`hypervisor.simlibvirt`),
    whose hosts cost less than vcsched itself; each followed by its harness alone."""
    from hypervisor.testhosts import write_scale_cluster

    rows = []
    steps = 10
    for s, scheme in enumerate(("test", "sim")):
        with tempfile.TemporaryDirectory(prefix="vcsched-scale-") as tmp:
            scale = write_scale_cluster(Path(tmp), hosts, vms_per_host, scheme=scheme)
            where = "" if scheme == "test" else " [sim]"
            commands = [(f"status --sample 0{where}",
                         ["status", "--cluster", str(scale.cluster_file), "--sample", "0", "--json"]),
                        (f"place (dry run){where}",
                         ["place", str(scale.request_file), "--cluster", str(scale.cluster_file), "--json"])]
            if scheme == "sim":  # the test driver's opens would be most of it: asked of the simulated hosts only
                headroom = ["headroom", "--vm", HEADROOM_SHAPE, "--cluster", str(scale.cluster_file), "--json"]
                commands += [(f"headroom{where}", headroom),
                             (f"headroom --failures 1{where}", [*headroom, "--failures", "1"])]
            for k, (name, args) in enumerate(commands):
                if on_progress is not None:
                    on_progress(5 * s + k, steps, f"{name} on {hosts} hosts")
                # The test driver cannot cap CPU: --apply would refuse the plan, so its dry run exits 1 as well,
                # after the same whole-plan check (which stops at the first cap step).
                expect = 1 if scheme == "test" and args[0] == "place" else 0
                walls, cpus = _whole([*vcsched, *args], repeat, expect=expect)
                rows.append(ScaleRow(name, hosts, scale.vms, walls, cpus, _calls(args, hosts, expect)))
            if scheme == "test":
                opens = time_opens(scale.cluster_file, hosts, repeat)
                rows.append(ScaleRow(OPENS_ROW, hosts, scale.vms, opens, opens, (2, 2)))
            else:
                loads = time_loads(scale.cluster_file, hosts, repeat)
                rows.append(ScaleRow(SIM_ROW, hosts, scale.vms, loads, loads, (0, 0)))
                hspace = shutil.which("hspace")
                if hspace is not None:
                    text = Path(tmp) / "ganeti.txt"
                    text.write_text(ganeti_text(hosts, vms_per_host))
                    argv = [hspace, "-t", str(text), "--standard-alloc", f"{HSPACE_DISK_MIB},{HEADROOM_MEMORY_MIB},1"]
                    try:
                        walls, cpus = _whole(argv, repeat, HSPACE_TIMEOUT_S)
                        rows.append(ScaleRow(HSPACE_ROW, hosts, scale.vms, walls, cpus, (0, 0)))
                    except subprocess.TimeoutExpired:
                        rows.append(ScaleRow(HSPACE_ROW, hosts, scale.vms, (HSPACE_TIMEOUT_S,), (HSPACE_TIMEOUT_S,),
                                             (0, 0), f"did not finish in {HSPACE_TIMEOUT_S:g} s"))
    if on_progress is not None:
        on_progress(steps, steps, "done")
    return rows


def ganeti_text(hosts: int, vms_per_host: int) -> str:
    """The cluster :func:`hypervisor.testhosts.write_scale_cluster` writes, in Ganeti's text format (``hspace
    -t``, htools(1)): the same nodes (cores, memory, none of it kept for the node), the same running instances
    of 1 vCPU and 512 MiB (plain disks of 1 GiB: with none, htools refuses every allocation for disk; a node has
    1 TiB, so that disk never binds), and an instance policy whose vCPU ratio (64) does not bind either: the
    memory-bound question the ``headroom`` rows ask."""
    from hypervisor.testhosts import CORES, HOST_MEMORY_MIB, VM_MEMORY_MIB

    disk = 1 << 20  # MiB per node: plenty
    group = "00000000-0000-0000-0000-000000000001"
    free = HOST_MEMORY_MIB - vms_per_host * VM_MEMORY_MIB
    nodes = [f"h{h}|{HOST_MEMORY_MIB}|0|{free}|{disk}|{disk - vms_per_host * HSPACE_DISK_MIB}|{CORES}|"
             f"{'M' if h == 0 else 'N'}|"
             f"{group}|1||N|1|0|1.0" for h in range(hosts)]
    instances = [f"vm{h * vms_per_host + k}|{VM_MEMORY_MIB}|{HSPACE_DISK_MIB}|1|running|Y|h{h}||plain||1|-"
                 for h in range(hosts) for k in range(vms_per_host)]
    std = f"{HEADROOM_MEMORY_MIB},1,{HSPACE_DISK_MIB},1,1,1"
    # The largest spec is the shape itself: hspace's tiered allocation (from the largest spec down) then asks the
    # same question as its standard one; tiered from a whole host's size took 11 s of CPU at 20 nodes.
    policy = f"|{std}|128,1,1,1,1,1;{std}|plain|64.0|32.0"
    return "\n".join([f"default|{group}|preferred||", "", *nodes, "", *instances, "", "", policy, ""])


def scale_markdown(rows: Sequence[ScaleRow], repeat: int) -> list[str]:
    """The Markdown section of the scale rows."""
    lines = ["", "## Across machines: status, place and headroom on 1,000 hosts", "",
             "`vcsched status --sample 0 --json`, `vcsched place REQUEST --json` (a dry run: one virtual cluster "
             f"of 8 VMs) and, on the simulated hosts, `vcsched headroom --vm {HEADROOM_SHAPE} --json` with and "
             "without `--failures 1`, on fake hosts of libvirt's test driver (`hypervisor/testhosts.py`: every "
             "`test:///DIR/hN.xml` an independent host with 8 cores, 32 GiB and running, capped, managed VMs), "
             f"whole processes: median of {repeat} run(s) after one untimed run, wall time and the CPU time "
             "(user + system) the process used; libvirt calls per host (the open included) counted on one run "
             "in-process.  Targets: " + ", ".join(f"{name} {t:g} s" for name, t in TARGETS.items()) + ".  "
             "The test driver's harness row is libvirt's test driver alone, without vcsched: opening "
             "and closing every host's connection one after the other, in-process (its CPU column repeats the "
             "wall time); the test driver parses the host's file and starts every domain on each open, which a "
             "real host does not, so that row is the harness's cost inside the commands' times.  The rows marked "
             "[sim] run the same commands on the same hosts served by the simulated libvirt (`sim:///DIR/hN.xml`, "
             "hypervisor/simlibvirt.py), which reads each node file once and answers from Python objects: what is "
             "left is vcsched's own cost plus that row's (CPU seconds of reading the files).  `place`'s dry run "
             "runs the whole-plan check `--apply` runs: on the test driver's hosts, which cannot cap CPU, it ends "
             "in the refusal `--apply` would make (exit 1, at the first cap step); on the simulated hosts it goes "
             "on to have each new VM's domain XML validated on its host (a define and an undefine).  "
             "The hspace row, when Ganeti's htools are installed, is `hspace -t FILE --standard-alloc "
             "1024,4096,1` on the same cluster "
             "written in Ganeti's text format (the same nodes and instances; disk and vCPUs do not bind; hspace "
             "keeps N+1 room, so its count is `headroom --failures 1`'s), "
             f"whole processes like vcsched's, each run bounded by {HSPACE_TIMEOUT_S:g} s.", "",
             "| command | hosts | VMs | wall (s) | CPU (s) | libvirt calls per host | target |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        calls = str(r.calls_per_host[0]) if r.calls_per_host[0] == r.calls_per_host[1] else \
            f"{r.calls_per_host[0]}–{r.calls_per_host[1]}"
        target = target_of(r.command)
        met = "" if target is None else "met" if r.wall_median <= target else "missed"
        met += f" (<= {target:g} s)" if target is not None else ""
        if r.unfinished:
            lines.append(f"| {r.command} | {r.hosts} | {r.vms} | > {r.wall_median:g} | – | – | {r.unfinished} |")
            continue
        lines.append(f"| {r.command} | {r.hosts} | {r.vms} | {r.wall_median:.3g} | {r.cpu_median:.3g} | {calls} | "
                     f"{met} |")
    return lines
