"""A cluster's TLS credentials, and the private files and directories it writes.

Every cluster this plugin starts has its own certificate authority: a key pair made at
start, which signs one certificate (and key) that the scheduler, the servers, their
nannies and every client present, then is thrown away. Each side requires the other's
certificate to be signed by that authority, so a client without the certificate, or
with another cluster's, cannot talk to any of the cluster's ports.

The credentials lie in ``X.tls/`` beside the scheduler file ``X.json``: a directory
created 0700 and checked (owner, mode, not a symlink) before use, files 0600 created
exclusively and read only when they are this user's (:mod:`..paths`).
"""

from __future__ import annotations

import datetime
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import paths
from ..errors import ClusterError
from ..paths import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE

if TYPE_CHECKING:
    from distributed import Security

__all__ = [
    "FIX",
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "Credentials",
    "open_private_append",
    "private_dir",
    "private_file",
    "write_private",
]

#: Long enough for a persistent cluster; it is made anew at every start.
VALIDITY = datetime.timedelta(days=365)


#: The fix for a planted path beside a scheduler file.
FIX = "remove it (another user may have planted it), or choose another --scheduler-file"


def private_dir(path: Path, *, tighten: bool = True, fix: str = FIX) -> Path:
    """Create ``path`` 0700, or check the one there (:func:`..paths.private_dir`);
    with ``tighten``, one of this user open to others is made 0700 (else refused,
    naming ``fix``: what to do, with the setting that chose the path)."""
    return paths.private_dir(path, fix, tighten=tighten)


def write_private(path: Path, data: str | bytes) -> None:
    """Write ``path`` 0600, atomically (a new file renamed over the old one); never
    over another user's file or a symlink (:func:`..paths.write_private`)."""
    paths.write_private(path, data, FIX)


def open_private_append(path: Path) -> int:
    """A descriptor appending to ``path``, created 0600; another user's file or a
    symlink is refused before anything is written (:func:`..paths.open_append`)."""
    return paths.open_append(path, FIX)


#: What SQLite creates beside a database file, with the database's mode.
SQLITE_SIDECARS = ("-wal", "-shm", "-journal")


def private_file(path: Path, fix: str = FIX) -> Path:
    """Make ``path`` a file only its owner reads: created empty 0600 (exclusively) if
    missing (its directory 0700 if missing), else made 0600 if it is this user's; a
    symlink, another user's file, or another user's SQLite sidecar beside it (which
    SQLite would open) is refused. An SQLite catalog made so keeps its journal and
    WAL files 0600 too (SQLite copies the mode). ``fix``: as for :func:`private_dir`."""
    if not path.parent.exists():
        private_dir(path.parent, fix=fix)
    if not paths.create_exclusive(path):
        os.close(paths.open_append(path, fix))  # checks it, and makes it 0600
    for suffix in SQLITE_SIDECARS:
        sidecar = path.with_name(path.name + suffix)
        if os.path.lexists(sidecar):
            os.close(paths.open_append(sidecar, fix))
    return path


@dataclass(frozen=True)
class Credentials:
    """The TLS files of one cluster, in ``directory``."""

    directory: Path

    @property
    def ca_file(self) -> Path:
        """The cluster's certificate authority (its certificate; the key is gone)."""
        return self.directory / "ca.pem"

    @property
    def cert_file(self) -> Path:
        """The certificate every member of the cluster and every client presents."""
        return self.directory / "cert.pem"

    @property
    def key_file(self) -> Path:
        """The certificate's private key."""
        return self.directory / "key.pem"

    @classmethod
    def beside(cls, scheduler_file: Path) -> Credentials:
        """The credentials of the cluster whose scheduler file is ``scheduler_file``."""
        return cls(Path(scheduler_file).with_suffix(".tls"))

    @classmethod
    def generate(cls, directory: Path) -> Credentials:
        """Make a new authority and certificate in ``directory`` (created 0700)."""
        private_dir(directory)
        ca_pem, cert_pem, key_pem = _new_authority_and_certificate()
        credentials = cls(directory)
        write_private(credentials.key_file, key_pem)
        write_private(credentials.cert_file, cert_pem)
        write_private(credentials.ca_file, ca_pem)
        return credentials

    def check(self, setting: str) -> Credentials:
        """These credentials, once their directory and files are there and private
        (each file opened without following a symlink, and this user's).
        ``setting`` names where they came from, for the message."""
        if not os.path.lexists(self.directory):
            raise ClusterError(
                f"{setting}: no TLS credentials directory {self.directory}. Fix: attach "
                "with the scheduler file of a cluster started by this plugin (its "
                "credentials lie beside it), or name them with --context-credentials."
            )
        private_dir(self.directory, tighten=False)
        for path in (self.ca_file, self.cert_file, self.key_file):
            try:
                os.close(paths.open_trusted(path, fix=FIX))
            except FileNotFoundError:
                raise ClusterError(
                    f"{setting}: the TLS credentials in {self.directory} are incomplete "
                    f"({path.name} is missing). Fix: restart the cluster "
                    "(snakemake-context down; snakemake-context up)."
                ) from None
        return self

    def security(self) -> Security:
        """Dask's Security for every role: TLS required, certificates checked both ways."""
        from distributed import Security

        cert, key = str(self.cert_file), str(self.key_file)
        return Security(
            require_encryption=True,
            tls_ca_file=str(self.ca_file),
            tls_client_cert=cert,
            tls_client_key=key,
            tls_scheduler_cert=cert,
            tls_scheduler_key=key,
            tls_worker_cert=cert,
            tls_worker_key=key,
        )

    def remove(self) -> None:
        """Delete the files and their directory (the cluster is gone); only from a
        directory of this user's, never through a symlink."""
        if paths.dir_problem(self.directory, tighten=False, create=False):
            return  # missing, or not ours to empty
        for path in (self.ca_file, self.cert_file, self.key_file):
            paths.remove_own(path)
        try:
            self.directory.rmdir()
        except OSError:
            pass


def _new_authority_and_certificate() -> tuple[bytes, bytes, bytes]:
    """A fresh CA (its key discarded) and a certificate it signed: (ca, cert, key) PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    cluster = secrets.token_hex(8)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"snakemake-context CA {cluster}")]
    )
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"snakemake-context {cluster}")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("snakemake-context")]), critical=False
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return (
        ca.public_bytes(pem),
        cert.public_bytes(pem),
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
