"""Entry point: the ``vcsched`` group and its commands, each imported only when it runs.

``vcsched --help`` lists the commands from the table below without importing
any of them, and ``vcsched solve`` imports the solver but not the libvirt
adapter, the adaptation or the benchmarks.  A new command goes in the table
with the first paragraph of its docstring (tests/test_cli_main.py checks both).
"""

from __future__ import annotations

import gc
import os
import sys

from cli.app import cli, stdout_for_vcsched_only

#: name -> (where the click command lives, its one-line summary: the first paragraph of its docstring)
COMMANDS: dict[str, tuple[str, str]] = {
    "solve": ("cli.solve:solve_cmd", "Place the jobs of INSTANCE.json on its hosts and report the yields."),
    "generate": ("cli.generate:generate_cmd",
                 "Generate a random instance as in the paper's experiments (section 4.1)."),
    "lab": ("cli.lab:lab_cmd",
            "A real local cluster: N libvirt hosts on this machine, for trying placements end to end."),
    "experiment": ("cli.experiment:experiment_cmd",
                   "Reproduce the paper's simulation experiments (section 4; parallel jobs: section 5)."),
    "bench": ("cli.bench:bench_cmd", "Time each solver on fixed, seeded instances of the paper's protocol."),
    "calibrate": ("cli.calibrate:calibrate_cmd",
                  "Measure how precisely and how quickly CPU, disk and network caps take effect."),
    "solve-adapt": ("cli.solve_adapt:solve_adapt_cmd",
                    "Re-place a running cluster, migrating at most --budget bytes, for the best minimum yield."),
    "adapt": ("cli.adapt:adapt_cmd",
              "Re-balance a running cluster: re-cap every managed VM and live-migrate a few, within --budget bytes."),
    "place": ("cli.place:place_cmd",
              "Decide whether a virtual cluster fits, and how: print the admission decision and the plan."),
    "headroom": ("cli.headroom:headroom_cmd",
                 "Say how many more VMs of one shape fit now, where, and at what minimum yield."),
    "apply": ("cli.apply:apply_cmd", "Apply a plan saved by `vcsched place`, `adapt` or `drain` with -o PLAN.json."),
    "repair": ("cli.repair:repair_cmd",
               "Settle VMs left in doubt by an interrupted migration (dry run unless --apply)."),
    "status": ("cli.status:status_cmd",
               "Show every host and VM of the cluster: caps, predicted yields and measured CPU, disk and network."),
    "cordon": ("cli.maintenance:cordon_cmd",
               "Put HOST in maintenance: no new VM and no migration lands on it (its VMs keep running)."),
    "uncordon": ("cli.maintenance:uncordon_cmd",
                 "Take HOST out of maintenance: it receives VMs again (`vcsched adapt` can move some back)."),
    "drain": ("cli.drain:drain_cmd",
              "Empty HOST by live migration within --budget bytes, for maintenance; --apply carries it out."),
    "recover": ("cli.recover:recover_cmd",
                "Run a failed host's VMs again on the survivors: fence it, then create them, most important first."),
    "restart": ("cli.restart:restart_cmd",
                "Start lost VMs again from their records in the definitions store, on the best hosts."),
    "adopt": ("cli.adopt:adopt_cmd",
              "Bring running domains that vcsched did not create under management, where they run."),
    "release": ("cli.adopt:release_cmd",
                "Hand managed VMs back: remove their caps, vcsched's metadata and their records; they keep running."),
    "simulate": ("cli.simulate:simulate_cmd",
                 "Simulate virtual clusters arriving and leaving over time, under every sharing policy."),
    "observe": ("cli.observe:observe_cmd",
                "Measure every managed VM's CPU use over a window and estimate what it needs."),
    "run": ("cli.run:run_cmd",
            "Run the controller: measure needs, follow them with caps, re-balance within a byte budget per interval."),
    "recommendations": ("cli.recommend:recommendations_cmd",
                        "List what `vcsched run --mode recommend` proposes: reason, predicted yields, steps."),
    "approve": ("cli.recommend:approve_cmd", "Apply recommendation ID now, under the cluster lock, if it still holds."),
    "skip": ("cli.recommend:skip_cmd",
             "Veto recommendation ID: it is closed, and the controller does not move its VMs again for --for."),
    "audit": ("cli.audit:audit_cmd",
              "Show how the last plans did: predicted against achieved yield, per plan and per VM."),
    "power": ("cli.power:power_cmd",
              "Power saving: which hosts sleep, the energy saved, the next decision; sleep, wake or clear a host."),
    "top": ("cli.top:top_cmd",
            "Watch the cluster live: hosts, VMs, caps, use, needs and yields, refreshed every --interval."),
}

for _name, (_where, _summary) in COMMANDS.items():
    cli.add_lazy_command(_name, _where, _summary)


#: The cyclic collector's thresholds for a command (Python's default: 700, 10, 10).  A command builds tens of
#: thousands of objects that live until it ends and form few cycles (the inventory of 1,000 hosts and 10,000 VMs:
#: parsed XML, one VmState each, and the documents made of them); at 700 that was ~350 collections, 0.13 s of a
#: `status`, and at 50,000 still two collections of 0.035 s of CPU in all (in-process, docs/benchmarks.md); at
#: 250,000 a `status` or `place` of 10,000 VMs runs none.
GC_THRESHOLDS = (250_000, 10, 10)
#: The commands that watch a cluster until stopped collect more often: what a long run leaves in cycles is
#: bounded lower (a full collection every 5 million net allocations).
WATCHING, WATCHING_GC_THRESHOLDS = frozenset({"run", "top"}), (50_000, 10, 10)


#: numpy's BLAS on one thread unless the caller says otherwise: OpenBLAS starts a thread per core when numpy is
#: imported, which costs every command ~0.03 s of CPU and up to 0.1 s of wall time on two cores (measured at
#: start-up, docs/benchmarks.md), and vcsched's arrays are too small for threads to pay (its LPs run in HiGHS).
BLAS_THREADS = {"OPENBLAS_NUM_THREADS": "1"}


def gc_thresholds(args: list[str]) -> tuple[int, int, int]:
    """The collector's thresholds for a command line (its first word that is not an option names the command)."""
    command = next((a for a in args if not a.startswith("-")), None)
    return WATCHING_GC_THRESHOLDS if command in WATCHING else GC_THRESHOLDS


def main() -> None:
    gc.set_threshold(*gc_thresholds(sys.argv[1:]))
    for name, value in BLAS_THREADS.items():  # before any command imports numpy
        os.environ.setdefault(name, value)
    before = _abandoned_now()
    with stdout_for_vcsched_only():
        try:
            cli(prog_name="vcsched")
        except SystemExit as exc:
            _exit_past_hung_hosts(exc.code, before)
            raise


def _abandoned_now() -> int:
    conns = sys.modules.get("hypervisor.connections")
    return 0 if conns is None else int(conns.abandoned_threads())


def _exit_past_hung_hosts(code: object, before: int = 0) -> None:
    """End at once (output flushed) when this command left threads blocked on hosts that did not answer.

    A command must return within the cluster's host_timeout of a hung host;
    the interpreter's clean-up would spend time on those threads.  Only the
    threads this command left (more than ``before``, the count when it
    started) end the process: a process that calls :func:`main` again (a test
    run) must not be ended, with its exit code, by threads an earlier call left.
    """
    if _abandoned_now() <= before or not (code is None or isinstance(code, int)):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    main()
