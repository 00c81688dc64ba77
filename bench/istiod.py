"""istiod (``pilot-discovery``, built by ``make reference``) as the peer the fleet benchmarks run beside.

``python -m bench.run --peer istiod`` runs each fleet scenario of the suite twice, one server after
the other on the same machine, config and simulator: meshpilot, then istiod. Both read the same
config directory in the ServiceEntry form of the scenario (istiod's file source reads Istio kinds
only), and the simulated sidecars are client sidecars whose addresses back no service (see
``Scenario.service_entries``), so both servers build the same resources for them.

istiod at this version does not start without a Kubernetes client (its ServiceEntry controller
asks the multicluster controller for the config cluster's namespaces), and with ``--configDir`` it
makes one only with the Kubernetes registry. So istiod also gets a kubeconfig for an API server
that holds nothing (``bench.kube_stub``, an empty cluster); its services all come from the
ServiceEntry files, as meshpilot's do. The API server's CPU is not counted as istiod's.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.server import ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
BINARY = ROOT / "build" / "reference" / "bin" / "pilot-discovery"


class MissingReference(RuntimeError):
    pass


def binary() -> Path:
    """The pilot-discovery binary, or a MissingReference error naming `make reference`."""
    if not BINARY.is_file():
        raise MissingReference(
            f"{BINARY.relative_to(ROOT)} is missing: run `make reference` (needs Go) to build istiod"
        )
    return BINARY


def version() -> str:
    """istiod's version string (``pilot-discovery version --short``)."""
    done = subprocess.run(
        [str(binary()), "version", "--short"], capture_output=True, text=True, check=False, timeout=60
    )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    # "client version: 1.31-dev"
    return lines[-1].rpartition(":")[2].strip() if lines else "unknown"


class IstiodProcess(ServerProcess):
    """``pilot-discovery discovery`` on a config directory, with the same probes as meshpilot's process.

    ``/ready`` is on ``--httpAddr`` and ``/metrics`` on ``--monitoringAddr``, as for meshpilot.
    """

    name = "istiod"

    def __init__(
        self,
        config_dir: Path,
        workdir: Path,
        *,
        kubeconfig: Path,
        debounce: str,
        connect_rate: int | None,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(config_dir, workdir, env=env)
        self.log = workdir / "istiod.log"
        missing = workdir / "absent"  # default MeshConfig and mesh networks, as meshpilot's without files
        self.argv = [
            str(binary()),
            "discovery",
            "--configDir",
            str(config_dir),
            # Services and endpoints come from the ServiceEntry files; the Kubernetes registry is
            # there because istiod needs a kube client, and its API server holds no services.
            "--registries",
            "Kubernetes",
            "--kubeconfig",
            str(kubeconfig),
            "--meshConfig",
            str(missing / "mesh"),
            "--networksConfig",
            str(missing / "meshNetworks"),
            "--grpcAddr",
            f"127.0.0.1:{self.grpc_port}",
            "--httpAddr",
            f"127.0.0.1:{self.http_port}",
            "--monitoringAddr",
            f"127.0.0.1:{self.monitoring_port}",
            # No TLS listeners: the simulator uses plaintext ADS (istiod's 15010), as against meshpilot.
            "--secureGRPCAddr",
            "",
            "--httpsAddr",
            "",
            "--ctrlz_port",
            str(free_port()),
            "--log_output_level",
            "all:warn",
            # Not its default 10 s of draining at the end of a run: nothing is measured then.
            "--shutdownDuration",
            "1s",
        ]
        knobs = {
            "POD_NAMESPACE": "istio-system",
            "POD_NAME": "istiod-bench",
            "REVISION": "default",
            # No CA: the bench needs no certificates, and meshpilot runs none.
            "ENABLE_CA_SERVER": "false",
            "PILOT_DEBOUNCE_AFTER": debounce,
        }
        if connect_rate is not None:
            knobs["PILOT_MAX_REQUESTS_PER_SECOND"] = str(connect_rate)
        self.env = {**self.env, **knobs, **(env or {})}
