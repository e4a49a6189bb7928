"""A real Prometheus Pushgateway (Debian package ``prometheus-pushgateway``) for the tests.

:class:`Pushgateway` starts the binary on a free port of 127.0.0.1, keeping what is pushed in
memory only, waits until it is ready, reads back what it serves on ``/metrics``, and stops it
by its pid.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from favorites_maintenance_tests.dev_stack import free_port
from favorites_maintenance_tests.system_packages import require_program, stop_process

INSTALL_HINT = "apt-get install -y prometheus-pushgateway"


def require_pushgateway() -> str:
    """The ``prometheus-pushgateway`` executable; without it skip the test, or fail it when
    ``CI=true``."""
    return require_program("prometheus-pushgateway", INSTALL_HINT)


class Pushgateway:
    """One Pushgateway process on 127.0.0.1.

    Args:
        binary: the ``prometheus-pushgateway`` executable (see :func:`require_pushgateway`).
    """

    def __init__(self, binary: str):
        self.binary = binary
        self.port: int | None = None
        self.folder: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        """Base URL, ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        if self.folder is None or not (self.folder / "pushgateway.log").exists():
            return ""
        return (self.folder / "pushgateway.log").read_text(errors="replace")

    def start(self, timeout: float = 10.0) -> "Pushgateway":
        """Start the gateway and wait until ``/-/ready`` answers.

        Raises:
            RuntimeError: it exited, or was not ready within ``timeout`` seconds; the message
                ends with its log.
        """
        attempts = 3  # another process may take the free port before the gateway binds it
        while True:
            attempts -= 1
            self.folder = Path(tempfile.mkdtemp(prefix="favorites-pushgateway-"))
            self.port = free_port()
            self._log = open(self.folder / "pushgateway.log", "ab")
            self._proc = subprocess.Popen(
                [self.binary, f"--web.listen-address=127.0.0.1:{self.port}",
                 "--persistence.file=", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                cwd=self.folder)
            try:
                self._wait_until_ready(timeout)
                return self
            except RuntimeError:
                port_taken = "address already in use" in self.log_text().lower()
                self.stop()
                if not port_taken or not attempts:
                    raise
            except BaseException:
                self.stop()
                raise

    def stop(self) -> None:
        """Stop the gateway by its pid and remove its folder; idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self) -> "Pushgateway":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def series(self, job: str) -> dict[str, tuple[dict[str, str], float]]:
        """What ``/metrics`` serves for the group of ``job``: metric name -> (labels, value).

        Raises:
            AssertionError: a name has more than one series in the group.
        """
        response = requests.get(f"{self.url}/metrics", timeout=10)
        response.raise_for_status()
        found: dict[str, tuple[dict[str, str], float]] = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                if sample.labels.get("job") == job:
                    assert sample.name not in found, f"two series named {sample.name}"
                    found[sample.name] = (sample.labels, sample.value)
        return found

    def _wait_until_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"the Pushgateway exited with code {self._proc.returncode}:"
                                   f"\n{self.log_text()}")
            try:
                if requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200 \
                        and self._proc.poll() is None:  # ours answered, not another process
                    return
            except requests.RequestException as exc:
                last = exc
            time.sleep(0.05)
        raise RuntimeError(f"the Pushgateway was not ready on {self.url} within {timeout} s "
                           f"({last}):\n{self.log_text()}")
