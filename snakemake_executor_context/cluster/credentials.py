"""A cluster's TLS credentials, and the private files and directories it writes.

Every cluster this plugin starts has its own certificate authority: a key pair made at
start, which signs one certificate (and key) that the scheduler, the servers, their
nannies and every client present, then is thrown away. Each side requires the other's
certificate to be signed by that authority, so a client without the certificate, or
with another cluster's, cannot talk to any of the cluster's ports.

The credentials lie in ``X.tls/`` beside the scheduler file ``X.json``: a directory
created 0700 and checked (owner, mode, not a symlink) before use, files 0600.
"""

from __future__ import annotations

import datetime
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ClusterError
from ..privacy import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE
from ..privacy import private_dir as _private_dir

if TYPE_CHECKING:
    from distributed import Security

__all__ = [
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


def private_dir(path: Path, *, tighten: bool = True) -> Path:
    """Create ``path`` 0700, or check the one there (:mod:`..privacy`); with
    ``tighten``, one of this user open to others is made 0700 (else refused)."""
    return _private_dir(
        path, ClusterError, "remove it, or choose another --scheduler-file.", tighten=tighten
    )


def write_private(path: Path, data: str | bytes) -> None:
    """Write ``path`` 0600, atomically (a new file renamed over the old one)."""
    raw = data.encode() if isinstance(data, str) else data
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def open_private_append(path: Path) -> int:
    """A descriptor appending to ``path``, which is (made) 0600; not through a symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    os.fchmod(fd, PRIVATE_FILE_MODE)
    return fd


def private_file(path: Path) -> Path:
    """Make ``path`` a file only its owner reads: created empty 0600 if missing (its
    directory 0700 if missing), else made 0600 if it is this user's. An SQLite catalog
    made so keeps its journal and WAL files 0600 too (SQLite copies the mode)."""
    if not path.parent.exists():
        private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    except FileExistsError:
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
            os.chmod(path, PRIVATE_FILE_MODE)
    else:
        os.close(fd)
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
        """These credentials, once their directory and files are there and private.
        ``setting`` names where they came from, for the message."""
        if not self.directory.is_dir():
            raise ClusterError(
                f"{setting}: no TLS credentials directory {self.directory}. Fix: attach "
                "with the scheduler file of a cluster started by this plugin (its "
                "credentials lie beside it), or name them with --context-credentials."
            )
        private_dir(self.directory, tighten=False)
        for path in (self.ca_file, self.cert_file, self.key_file):
            if not path.is_file():
                raise ClusterError(
                    f"{setting}: the TLS credentials in {self.directory} are incomplete "
                    f"({path.name} is missing). Fix: restart the cluster "
                    "(snakemake-context down; snakemake-context up)."
                )
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
        """Delete the files and their directory (the cluster is gone)."""
        for path in (self.ca_file, self.cert_file, self.key_file):
            path.unlink(missing_ok=True)
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
