"""The client side of libvirt's TLS: checking the ``pki`` directory a cluster file names.

libvirt reads a client's certificates from one directory when the URI says
``pkipath=DIR``: ``cacert.pem`` (the CA that signed every host's server
certificate), ``clientcert.pem`` and ``clientkey.pem``.  vcsched checks that
directory before it opens anything, so a missing file is one line naming it
rather than libvirt's "Cannot access CA certificate" on every host, and it
refuses a private key that other users can read — as ssh refuses such a key —
because whoever can read it can manage every host of the cluster.
"""

from __future__ import annotations

import stat
from pathlib import Path

from vcsched.errors import InputError

#: The files libvirt reads from a ``pkipath`` directory (client side).
PKI_FILES = ("cacert.pem", "clientcert.pem", "clientkey.pem")
PRIVATE_KEY = "clientkey.pem"


def check_pki(where: str, directory: str) -> Path:
    """``directory`` if it holds the three client files and its key is private; else InputError naming it."""
    root = Path(directory)
    if not root.is_dir():
        raise InputError(f"{where}: {directory!r} is not a directory")
    missing = [f for f in PKI_FILES if not (root / f).is_file()]
    if missing:
        raise InputError(f"{where}: {directory!r} lacks {', '.join(missing)} (a pki directory holds "
                         f"{', '.join(PKI_FILES)})")
    mode = stat.S_IMODE((root / PRIVATE_KEY).stat().st_mode)
    if mode & 0o077:
        raise InputError(f"{where}: private key {root / PRIVATE_KEY} has mode {mode:04o}: readable by group or "
                         f"others (chmod 600 it)")
    return root
