"""Where recommendations live: the cluster's coordination backend, beside its lock (docs/recommendations.md).

* ``file://DIR`` (the default, DIR = the state directory's ``coordination``): ``DIR/recommendations-KEY.json``,
  read-modify-written under an ``fcntl`` lock on ``DIR/recommendations-KEY.lock`` and replaced atomically
  (:func:`hypervisor.files.write_atomic`), so a reader sees the old book or the new one, never half of one;
* ``etcd3+http(s)://HOST:PORT``: the key ``/vcsched/recommendations/KEY``, updated by compare-and-swap (etcd3gw's
  ``replace``: the new book is written only if the key still holds the book it was computed from), so every
  operator and a standby controller on any machine see one list.

``KEY`` is the cluster lock's key (the key its hosts are claimed by, acting/lock_names.py; the first, when they
are claimed by several), so two files for the same hosts share one book, as they share one lock.  The book
itself and every transition are pure (:mod:`vcsched.control.recommend`); this module only reads and writes it.

The same mechanism keeps every other document a cluster's controllers and operators share on that backend
(:class:`SharedDocument`): the audits of applied plans (acting/audits.py) live beside the book, as
``audits-KEY.json`` / ``/vcsched/audits/KEY``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import urlparse

from acting.lock import CoordinationDown
from hypervisor.files import write_atomic
from vcsched.control.recommend import Book
from vcsched.errors import VcschedError

T = TypeVar("T")
D = TypeVar("D")
#: Compare-and-swap attempts before giving up on an etcd that keeps changing under us.
CAS_TRIES = 20


class SharedDocument(Generic[D]):
    """One JSON document ``name`` of one cluster (``key``) on the coordination backend ``url``, read whole and
    changed by pure functions applied atomically (module docstring)."""

    def __init__(self, url: str, key: str, name: str, load: Callable[[Any], D], dump: Callable[[D], Any],
                 empty: Callable[[], D], *, timeout: float = 5.0) -> None:
        self.url = url
        self.key = key
        self.name = name
        self._load, self._dump, self._empty = load, dump, empty
        #: Seconds one etcd call may take (a controller passes a fraction of its lock's TTL: a hung etcd must not
        #: hold up its standing down).
        self.timeout = timeout
        parsed = urlparse(url)
        self._file = Path(parsed.path) / f"{name}-{key}.json" if parsed.scheme == "file" else None
        self._prefix = f"/vcsched/{name}/"
        self._client: Any = None
        if not self.supports(url):
            raise VcschedError(f"coordination {url}: {name} are kept on file:// or etcd3 backends only")

    @staticmethod
    def supports(url: str) -> bool:
        """Whether recommendations can be kept on the coordination backend ``url`` (file and etcd; the other tooz
        drivers are accepted for the lock only)."""
        scheme = urlparse(url).scheme
        return scheme == "file" or scheme.startswith("etcd3")

    # ------------------------------------------------------------------ file

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        assert self._file is not None
        self._file.parent.mkdir(parents=True, exist_ok=True)
        with self._file.with_suffix(".lock").open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _read_file(self) -> D:
        assert self._file is not None
        try:
            text = self._file.read_text()
        except FileNotFoundError:
            return self._empty()
        return self._load(json.loads(text))

    def _write_file(self, doc: D) -> None:
        assert self._file is not None
        write_atomic(self._file, json.dumps(self._dump(doc), indent=1) + "\n")  # readers: the old one or the new

    # ------------------------------------------------------------------ etcd

    def _etcd(self) -> Any:
        if self._client is None:
            from etcd3gw.client import Etcd3Client  # lazy: only for an etcd backend

            parsed = urlparse(self.url)
            protocol = "https" if parsed.scheme.endswith("https") else "http"
            self._client = Etcd3Client(host=parsed.hostname or "localhost", port=parsed.port or 2379,
                                       protocol=protocol, timeout=self.timeout)
        return self._client

    def _etcd_get(self) -> tuple[bytes | None, D]:
        try:
            values = self._etcd().get(self._prefix + self.key)
        except Exception as exc:
            raise CoordinationDown(f"coordination service {self.url} unreachable: {exc}; nothing changed") from None
        if not values:
            return None, self._empty()
        raw = values[0] if isinstance(values[0], bytes) else str(values[0]).encode()
        return raw, self._load(json.loads(raw))

    # ------------------------------------------------------------------ both

    def read(self) -> D:
        if self._file is not None:
            return self._read_file()
        return self._etcd_get()[1]

    def update(self, change: Callable[[D], tuple[D, T]]) -> T:
        """Apply the pure ``change`` to the document atomically; returns its second value.  A refusal it raises
        leaves the document as it was."""
        if self._file is not None:
            with self._file_lock():
                book, out = change(self._read_file())
                self._write_file(book)
                return out
        for _ in range(CAS_TRIES):
            raw, doc = self._etcd_get()
            new, out = change(doc)
            text = json.dumps(self._dump(new))
            try:
                done = self._etcd().create(self._prefix + self.key, text) if raw is None else \
                    self._etcd().replace(self._prefix + self.key, raw, text)
            except Exception as exc:
                raise CoordinationDown(f"coordination service {self.url} unreachable: {exc}; nothing changed") \
                    from None
            if done:
                return out
        raise CoordinationDown(f"coordination service {self.url}: the {self.name} kept changing "
                               f"({CAS_TRIES} tries); nothing changed")


class RecommendationStore(SharedDocument[Book]):
    """The recommendations book of one cluster (``key``) on the coordination backend ``url``."""

    def __init__(self, url: str, key: str, *, timeout: float = 5.0) -> None:
        super().__init__(url, key, "recommendations", Book.from_dict, Book.to_dict, Book, timeout=timeout)
