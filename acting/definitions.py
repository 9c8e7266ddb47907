"""The definitions store: what it takes to start a managed VM again, kept where a dead host cannot take it along.

A VM's definition (its domain XML and vcsched's metadata) lives on its host.
When that host dies, nothing else holds it, and ``vcsched recover`` or the
controller could not restart the VM elsewhere.  So every command that
creates, adopts, migrates, re-needs, releases or removes a managed VM also writes its
*definition record* here, under the cluster lock, right after the step is
verified.

**What a record holds.**  The ``create`` step the VM was made with
(:class:`vcsched.plans.steps.CreateStep`: virtual cluster, vCPUs, memory, CPU
need, boot — kernel, template or image —, floor, rules, priority, disk and
network rates), with ``host`` the host it runs on now, plus the time of the
last write.  That is the request the VM came from, bound to one VM name, so a
restart is an ordinary create step of vcsched's own plan: checked, capped from
its first instant and verified like any other.

**Where.**  In the coordination backend, beside the cluster lock, because it
is the one place every vcsched command and the controller's leader must reach
before they change anything, and the place an operator already made
available (production: an etcd cluster, replicated by quorum, outliving any
one host).  ``file://DIR`` (one machine): ``DIR/definitions/<cluster>/<vm>.json``,
written atomically (a temporary file, fsync, rename, fsync of the directory),
so a crash leaves the old record or the new one, never half of one.
``etcd3+http(s)://HOST:PORT``: the key ``/vcsched/definitions/<cluster>/<vm>``
(one put is atomic).

**Why not libvirt on a survivor.**  Defining a copy of every VM on another
host would leave an inactive domain with the same UUID and name there: an
operator's ``virsh start``, an autostart flag or a careless tool starts a
second copy, which is exactly what must never happen (docs/repair.md,
"A VM never runs twice"); every migration would have to rewrite copies on
hosts that may be down themselves; and inventories would list the copies.
The coordination backend holds records, not domains: nothing can start them.

Records of VMs created before this store existed are missing; ``recover``
reports such VMs as stranded ("no definition recorded").
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from acting.executor import DONE, SKIPPED, StepResult
from hypervisor import hazards
from vcsched.control.lost import Lost, awaiting, lost_vms
from vcsched.errors import InputError, VcschedError
from vcsched.inventory import Inventory
from vcsched.plans.steps import AdoptStep, CreateStep, MigrateStep, ReleaseStep, RemoveStep, SetNeedStep, Step

ETCD_PREFIX = "/vcsched/definitions/"


class StoreError(VcschedError):
    """The definitions store cannot be read or written (exit 1)."""

    exit_code = 1


@dataclass(frozen=True)
class Definition:
    """One VM's record: its create step (``host`` = where it runs now) and when it was written."""

    step: CreateStep
    updated: float

    @property
    def vm(self) -> str:
        return self.step.vm

    @property
    def host(self) -> str:
        return self.step.host

    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "create": self.step.to_dict(), "updated": self.updated}

    @staticmethod
    def from_dict(where: str, d: Any) -> Definition:
        if not isinstance(d, Mapping) or d.get("version") != 1 or "create" not in d:
            raise InputError(f"{where}: not a vcsched definition record (version 1)")
        return Definition(CreateStep.from_dict(f"{where}.create", d["create"]), float(d.get("updated", 0.0)))


class Backend(Protocol):
    def put(self, key: str, text: str) -> None: ...
    def get(self, key: str) -> str | None: ...
    def delete(self, key: str) -> None: ...
    def items(self, prefix: str) -> Iterator[tuple[str, str]]: ...


class FileBackend:
    """Records as files under a directory, each written atomically."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def put(self, key: str, text: str) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def get(self, key: str) -> str | None:
        try:
            return self._path(key).read_text()
        except FileNotFoundError:
            return None

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def items(self, prefix: str) -> Iterator[tuple[str, str]]:
        directory = self.root / prefix
        if not directory.is_dir():
            return
        for p in sorted(directory.glob("*.json")):
            with contextlib.suppress(FileNotFoundError):
                yield f"{prefix}/{p.stem}", p.read_text()


class EtcdBackend:
    """Records as etcd keys (etcd3gw, the client tooz's etcd3 driver uses for the lock)."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        import etcd3gw  # lazy: only for an etcd cluster

        parsed = urlparse(url)
        protocol = "https" if parsed.scheme.endswith("https") else "http"
        self.client = etcd3gw.client(host=parsed.hostname or "localhost", port=parsed.port or 2379,
                                     protocol=protocol, timeout=timeout)

    def put(self, key: str, text: str) -> None:
        self.client.put(ETCD_PREFIX + key, text)

    def get(self, key: str) -> str | None:
        values = self.client.get(ETCD_PREFIX + key)
        if not values:
            return None
        v = values[0]
        return v.decode() if isinstance(v, bytes) else str(v)

    def delete(self, key: str) -> None:
        self.client.delete(ETCD_PREFIX + key)

    def items(self, prefix: str) -> Iterator[tuple[str, str]]:
        for value, meta in self.client.get_prefix(ETCD_PREFIX + prefix + "/"):
            raw = meta["key"]
            key = raw.decode() if isinstance(raw, bytes) else str(raw)
            yield key[len(ETCD_PREFIX):], value.decode() if isinstance(value, bytes) else str(value)


class DefinitionStore:
    """The records of one cluster (by the cluster file's ``name``) on one coordination backend."""

    def __init__(self, backend: Backend, cluster: str, where: str) -> None:
        self.backend = backend
        self.cluster = cluster
        self.where = where  # for messages: the URL

    @staticmethod
    def for_url(url: str, cluster: str) -> DefinitionStore:
        """The store of coordination URL ``url`` (``file://DIR`` or ``etcd3+http(s)://...``)."""
        parsed = urlparse(url)
        if parsed.scheme == "file":
            return DefinitionStore(FileBackend(Path(parsed.path) / "definitions"), cluster, url)
        if parsed.scheme.startswith("etcd3"):
            return DefinitionStore(EtcdBackend(url), cluster, url)
        raise StoreError(f"coordination {url}: vcsched keeps VM definitions only on file:// or etcd3 backends")

    def _key(self, vm: str) -> str:
        return f"{self.cluster}/{vm}"

    def _guard(self, what: str) -> contextlib.AbstractContextManager[None]:
        return _failing_as(f"definitions store {self.where}: cannot {what}")

    def put(self, step: CreateStep) -> None:
        with self._guard(f"record VM {step.vm}"):
            self.backend.put(self._key(step.vm), json.dumps(Definition(step, time.time()).to_dict(), sort_keys=True))

    def get(self, vm: str) -> Definition | None:
        with self._guard(f"read VM {vm}"):
            text = self.backend.get(self._key(vm))
        return None if text is None else _parse(f"definition of {vm}", text)

    def delete(self, vm: str) -> None:
        with self._guard(f"remove VM {vm}"):
            self.backend.delete(self._key(vm))

    def all(self) -> dict[str, Definition]:
        """Every record of the cluster, by VM name (a record that does not parse is bad data: exit 2)."""
        with self._guard("list definitions"):
            items = list(self.backend.items(self.cluster))
        return {d.vm: d for d in (_parse(f"definition {k}", text) for k, text in items)}

    def records(self) -> list[tuple[CreateStep, float]]:
        """Every record as ``(create step, time written)``: what :func:`vcsched.control.lost.lost_vms` reads."""
        return [(d.step, d.updated) for d in sorted(self.all().values(), key=lambda d: d.vm)]

    # Fenced hosts: a recovery that powered a host off says so here, so that every command (status, restart)
    # can tell a VM that runs nowhere for sure (lost) from one whose host may still run it (awaiting recovery).
    # Kept beside the records, under a key no cluster name can take (names start with a letter or digit).

    def _fence_key(self, host: str) -> str:
        return f".fenced/{self.cluster}/{host}"

    def mark_fenced(self, host: str, at: float | None = None) -> None:
        """Record that ``host`` was fenced (powered off by its agent) at ``at`` (default: now)."""
        with self._guard(f"record host {host} fenced"):
            self.backend.put(self._fence_key(host), json.dumps({"host": host, "fenced": at or time.time()}))

    def clear_fenced(self, host: str) -> None:
        """``host`` answers again: it is no longer fenced."""
        with self._guard(f"clear host {host} fenced"):
            self.backend.delete(self._fence_key(host))

    def fenced(self) -> dict[str, float]:
        """The hosts a recovery fenced, and when (Unix seconds)."""
        with self._guard("list fenced hosts"):
            items = list(self.backend.items(f".fenced/{self.cluster}"))
        out = {}
        for key, text in items:
            try:
                doc = json.loads(text)
                out[str(doc["host"])] = float(doc["fenced"])
            except (ValueError, KeyError, TypeError):
                raise InputError(f"fence record {key}: not a vcsched fence record") from None
        return out

    def lost(self, inventory: Inventory) -> tuple[Lost, ...]:
        """The recorded VMs that run nowhere on ``inventory``'s answering hosts (:func:`lost_vms`)."""
        return lost_vms(inventory, self.records(), self.fenced(),
                        ignore_down_hosts=hazards.on(hazards.LOST_WHILE_HOLDER_DOWN))  # a mutation switch (tests)

    def on(self, host: str) -> list[Definition]:
        """The records of VMs that ran on ``host`` when last written."""
        return sorted((d for d in self.all().values() if d.host == host), key=lambda d: d.vm)

    def to_recover(self, host: str, inventory: Inventory) -> list[CreateStep]:
        """What a recovery of failed ``host`` reads: the records of VMs that ran on it when last written, and of
        those that await it (:func:`vcsched.control.lost.awaiting`: only that host may still hold them)."""
        extra = awaiting(inventory, self.records(), self.fenced(), host)
        return [d.step for d in self.on(host)] + sorted(extra, key=lambda step: step.vm)

    def record(self, steps: Iterable[Step]) -> None:
        """Bring the records up to date with steps that took effect (done or already in place)."""
        for step in steps:
            if isinstance(step, CreateStep):
                self.put(step)
            elif isinstance(step, AdoptStep):  # its definition: its own XML, so a restart defines it again
                self.put(step.definition)
            elif isinstance(step, RemoveStep | ReleaseStep):
                self.delete(step.vm)
            elif isinstance(step, MigrateStep):
                self.moved(step.vm, step.host)
            elif isinstance(step, SetNeedStep):
                old = self.get(step.vm)
                if old is not None:  # else a VM from before the store: nothing to update
                    self.put(dataclasses.replace(old.step, cpu_need_cores=step.cpu_need_cores))

    def moved(self, vm: str, host: str) -> None:
        """The record of ``vm`` names ``host``, where it now runs: a migration recorded, or repair's resume of its
        paused arrival there (:meth:`acting.unit_of_work.UnitOfWork.settle_in_doubt`).  A VM with no record (from
        before the store) is left without one.  Written even when it names ``host`` already: the write's time is
        the last moment vcsched knew the VM ran there (vcsched/control/lost.py)."""
        old = self.get(vm)
        if old is not None:
            self.put(dataclasses.replace(old.step, host=host))


def _parse(where: str, text: str) -> Definition:
    try:
        doc = json.loads(text)
    except ValueError:
        raise InputError(f"{where}: not JSON") from None
    return Definition.from_dict(where, doc)


@contextlib.contextmanager
def _failing_as(message: str) -> Iterator[None]:
    try:
        yield
    except (InputError, StoreError):
        raise
    except Exception as exc:  # OSError, etcd3gw's connection errors: the store is unreachable
        raise StoreError(f"{message}: {exc}") from None


def recorder(store: DefinitionStore | None, warn: Callable[[str], None],
             then: Callable[[StepResult], None] | None = None) -> Callable[[StepResult], None]:
    """An ``on_step`` for :func:`acting.executor.apply_plan`: each step that took effect is recorded as it
    finishes (so an interrupted plan still records what it did); a store that cannot be written is said through
    ``warn`` (the step itself stands: the VM runs, only its restart elsewhere would lack the record)."""

    def on_step(result: StepResult) -> None:
        if store is not None and result.outcome in (DONE, SKIPPED):
            try:
                store.record([result.step])
            except (StoreError, InputError) as exc:
                warn(f"{exc}: VM {result.step.vm} could not be restarted elsewhere if its host failed")
        if then is not None:
            then(result)

    return on_step
