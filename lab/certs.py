"""The lab's certificates for libvirt over TLS, made with ``openssl`` (``certtool`` is not assumed).

One CA per lab; one server certificate per host whose subjectAltName is the
host's loopback address (libvirt's client and QEMU's migration TLS both check
the address they dial against it); one client certificate, used both by
vcsched (the cluster file's ``pki``) and by each host's QEMU when it sends a
migration stream with VIR_MIGRATE_TLS.  Every private key is written 0600.

Where they go::

    <lab>/pki/            cacert.pem clientcert.pem clientkey.pem   (vcsched's pkipath; ca.key stays here)
    <lab>/h<N>/etc/pki/   cacert.pem servercert.pem serverkey.pem   (libvirtd: /etc/libvirt/pki/ in its namespace)
    <lab>/h<N>/etc/pki/qemu/  ca-cert.pem server-cert.pem server-key.pem client-cert.pem client-key.pem
                          (qemu.conf default_tls_x509_cert_dir)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from vcsched.errors import VcschedError

DAYS = 3650


class CertError(VcschedError):
    """openssl failed (the lab cannot serve TLS)."""


def _openssl(*args: str) -> None:
    if shutil.which("openssl") is None:
        raise CertError("openssl is not installed (the TLS lab makes its certificates with it)")
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-2:])
        raise CertError(f"openssl {args[0]} failed: {tail}")


def _private(path: Path) -> None:
    os.chmod(path, 0o600)


def make_ca(pki: Path, lab_id: str) -> None:
    """``pki/cacert.pem`` and ``pki/ca.key`` (kept: later hosts are signed with it); idempotent."""
    pki.mkdir(parents=True, exist_ok=True)
    os.chmod(pki, 0o700)
    if (pki / "cacert.pem").is_file() and (pki / "ca.key").is_file():
        return
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", str(pki / "ca.key"), "-out", str(pki / "cacert.pem"), "-days", str(DAYS),
             "-subj", f"/O=vcsched lab {lab_id}/CN=vcsched lab {lab_id} CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _private(pki / "ca.key")


def _sign(pki: Path, key: Path, cert: Path, subject: str, extensions: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        csr, ext = Path(tmp) / "req.csr", Path(tmp) / "ext.cnf"
        ext.write_text(extensions)
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
                 "-out", str(csr), "-subj", subject)
        _private(key)
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(pki / "cacert.pem"), "-CAkey", str(pki / "ca.key"),
                 "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-out", str(cert), "-days", str(DAYS),
                 "-extfile", str(ext))


def make_client(pki: Path, lab_id: str) -> None:
    """``pki/clientcert.pem`` + ``pki/clientkey.pem`` (0600): what vcsched presents to every host."""
    if (pki / "clientcert.pem").is_file() and (pki / "clientkey.pem").is_file():
        return
    _sign(pki, pki / "clientkey.pem", pki / "clientcert.pem", f"/O=vcsched lab {lab_id}/CN=vcsched",
          "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n")


def make_host(pki: Path, etc: Path, address: str, lab_id: str) -> None:
    """A host's server certificate for ``address`` and QEMU's migration TLS directory, under its ``etc``."""
    out = etc / "pki"
    (out / "qemu").mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)
    shutil.copyfile(pki / "cacert.pem", out / "cacert.pem")
    _sign(pki, out / "serverkey.pem", out / "servercert.pem", f"/O=vcsched lab {lab_id}/CN={address}",
          f"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
          f"extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:{address}\n")
    q = out / "qemu"
    for src, dst in (("cacert.pem", "ca-cert.pem"), ("servercert.pem", "server-cert.pem"),
                     ("serverkey.pem", "server-key.pem")):
        shutil.copyfile(out / src, q / dst)
    shutil.copyfile(pki / "clientcert.pem", q / "client-cert.pem")
    shutil.copyfile(pki / "clientkey.pem", q / "client-key.pem")
    for key in (q / "server-key.pem", q / "client-key.pem"):
        _private(key)


def make_foreign_client(dest: Path, trusted_ca: Path) -> Path:
    """A pki directory trusting ``trusted_ca`` but whose client certificate comes from a CA of its own
    (tests: every host must refuse it)."""
    own = dest / "own-ca"
    make_ca(own, "stranger")
    make_client(own, "stranger")
    for f in ("clientcert.pem", "clientkey.pem"):
        shutil.copyfile(own / f, dest / f)
    _private(dest / "clientkey.pem")
    shutil.copyfile(trusted_ca, dest / "cacert.pem")
    return dest
