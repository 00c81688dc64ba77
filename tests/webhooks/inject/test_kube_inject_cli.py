"""``meshpilot kube-inject`` as a user runs it: a subprocess reading a file or stdin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

SRC = Path(__file__).resolve().parents[3] / "src"

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: hello
  namespace: shop
spec:
  selector:
    matchLabels: {app: hello}
  template:
    metadata:
      labels: {app: hello}
    spec:
      containers:
      - name: hello
        image: hello:1
"""

LIST = """\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: settings}
  data: {key: value}
- apiVersion: batch/v1
  kind: CronJob
  metadata: {name: nightly}
  spec:
    schedule: "0 0 * * *"
    jobTemplate:
      spec:
        template:
          spec:
            restartPolicy: Never
            containers:
            - name: job
              image: job:1
"""


def _run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-m", "meshpilot.cli.main", "kube-inject", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def _env(container: dict[str, Any], name: str) -> Any:
    return next(e.get("value") for e in container["env"] if e["name"] == name)


def test_deployment_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text(DEPLOYMENT)
    done = _run(["-f", str(path)])
    assert done.returncode == 0, done.stderr
    (out,) = list(yaml.safe_load_all(done.stdout))
    template = out["spec"]["template"]
    assert [c["name"] for c in template["spec"]["containers"]] == ["hello", "istio-proxy"]
    proxy = template["spec"]["containers"][1]
    assert _env(proxy, "ISTIO_META_OWNER") == "kubernetes://apis/apps/v1/namespaces/shop/deployments/hello"
    assert _env(proxy, "ISTIO_META_WORKLOAD_NAME") == "hello"
    assert "sidecar.istio.io/status" in template["metadata"]["annotations"]
    assert out["spec"]["selector"] == {"matchLabels": {"app": "hello"}}


def test_list_from_stdin_injects_the_cronjob_and_keeps_the_configmap() -> None:
    done = _run(["-f", "-"], stdin=LIST)
    assert done.returncode == 0, done.stderr
    (out,) = list(yaml.safe_load_all(done.stdout))
    configmap, cronjob = out["items"]
    assert configmap == yaml.safe_load(LIST)["items"][0]
    pod_spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod_spec["containers"]] == ["job", "istio-proxy"]


def test_opted_out_workload_is_unchanged_with_a_warning() -> None:
    opted_out = DEPLOYMENT.replace(
        "labels: {app: hello}", 'labels: {app: hello, sidecar.istio.io/inject: "false"}'
    )
    done = _run(["-f", "-"], stdin=opted_out)
    assert done.returncode == 0
    assert yaml.safe_load(done.stdout) == yaml.safe_load(opted_out)
    assert "Skipping injection" in done.stderr


def test_bad_input_and_missing_file_fail_cleanly(tmp_path: Path) -> None:
    done = _run(["-f", "-"], stdin="a: [unclosed")
    assert done.returncode == 2
    assert "not valid YAML" in done.stderr and "Traceback" not in done.stderr
    missing = _run(["-f", str(tmp_path / "nope.yaml")])
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_inject_config_dir_is_read(tmp_path: Path) -> None:
    (tmp_path / "config").write_text("policy: enabled\ntemplates: {}\n")
    (tmp_path / "values").write_text("global:\n  hub: registry.example.com/istio\n  tag: '9.9'\n")
    done = _run(["-f", "-", "--inject-config", str(tmp_path)], stdin=DEPLOYMENT)
    assert done.returncode == 0, done.stderr
    proxy = yaml.safe_load(done.stdout)["spec"]["template"]["spec"]["containers"][1]
    assert proxy["image"] == "registry.example.com/istio/proxyv2:9.9"


def test_malformed_objects_fail_cleanly_or_pass_through() -> None:
    bad_metadata = _run(["-f", "-"], stdin="apiVersion: apps/v1\nkind: Deployment\nmetadata: 3\n")
    assert bad_metadata.returncode == 2 and "metadata is not a mapping" in bad_metadata.stderr
    bad_items = _run(["-f", "-"], stdin="apiVersion: v1\nkind: List\nitems: true\n")
    assert bad_items.returncode == 2 and "items is not a list" in bad_items.stderr
    odd_kind = _run(["-f", "-"], stdin="kind: {a: 1}\nx: 1\n")
    assert odd_kind.returncode == 0 and yaml.safe_load(odd_kind.stdout) == {"kind": {"a": 1}, "x": 1}
