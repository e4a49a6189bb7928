"""A real Prometheus Pushgateway (Debian package ``prometheus-pushgateway``) for the tests.

:class:`Pushgateway` starts the binary on a free port of 127.0.0.1, keeping what is pushed in
memory only, waits until it is ready, reads back what it serves on ``/metrics``, and stops it
by its pid.
"""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families

from favorites_maintenance.local.processes import Probe
from favorites_maintenance_tests.helpers.system_packages import ServerProcess, require_program

INSTALL_HINT = "apt-get install -y prometheus-pushgateway"


def require_pushgateway() -> str:
    """The ``prometheus-pushgateway`` executable; without it skip the test, or fail it when
    ``CI=true``."""
    return require_program("prometheus-pushgateway", INSTALL_HINT)


class Pushgateway(ServerProcess):
    """One Pushgateway process on 127.0.0.1, keeping what is pushed in memory only.

    Args:
        binary: the ``prometheus-pushgateway`` executable (see :func:`require_pushgateway`).
    """

    name = "pushgateway"

    @property
    def url(self) -> str:
        """Base URL, ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        return [self.binary, f"--web.listen-address=127.0.0.1:{self.port}",
                "--persistence.file=", "--log.level=warn"]

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

    def _probe(self) -> Probe:
        return f"{self.url}/-/ready"
