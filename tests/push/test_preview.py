"""The change preview in a server of this process: validation as the webhook, the live server left
unchanged, the prediction against what the push then sends, and the time it holds the loop.

(``tests/integration/test_preview_explain.py`` does the same against a meshpilot process, over
HTTP, on several golden cases.)
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml
from support.ads_recorder import Recorder
from support.golden import agent_metadata
from support.kube import write
from support.xds_server import running, settings_for

from meshpilot.push.preview import MAX_BODY_BYTES, preview
from meshpilot.push.preview_change import ChangeReader
from meshpilot.push.preview_scratch import copy_index
from meshpilot.server.app import DiscoveryApp

CASE = Path(__file__).parents[1] / "golden" / "cases" / "http-routing"
PRODUCTPAGE = "sidecar~10.1.0.10~productpage-v1.default~default.svc.cluster.local"
REVIEWS = "sidecar~10.1.0.21~reviews-v1.default~default.svc.cluster.local"


def _vs(weights: tuple[int, int]) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((CASE / "config.yaml").read_text()) if d]
    vs = next(d for d in docs if d["kind"] == "VirtualService" and d["metadata"]["name"] == "reviews")
    split = next(r for r in vs["spec"]["http"] if r.get("name") == "split")
    split["route"][0]["weight"], split["route"][1]["weight"] = weights
    return vs


def _predicted(result: dict[str, Any]) -> dict[str, set[tuple[str, str, str]]]:
    return {
        p["proxy"]: {(r["type"], r["name"], r["change"]) for r in p["resources"]} for p in result["pushes"]
    }


def _live_state(app: DiscoveryApp) -> tuple[Any, ...]:
    """What a preview must leave as it found it."""
    store = app.store
    configs = tuple((c.key, c.spec_hash) for kind in store.kinds() for c in store.configs(kind))
    services = tuple(sorted(repr(s) for s in app.registry.services()))
    endpoints = tuple(
        sorted((h, n, str(sorted(shards.shards.items()))) for h, n, shards in app.index.services())
    )
    proxies = tuple(
        (c.id, id(c.proxy.sidecar_scope), tuple(sorted(c.watched))) for c in app.server.connections.values()
    )
    cache = app.server.cache
    assert cache is not None
    cached = tuple(sorted((str(t), len(c)) for t, c in cache.types.items()))
    reads = app.metrics.registry.get_sample_value("xds_cache_reads_total", {"type": "miss"})
    return configs, services, endpoints, proxies, app.server.push_context, app.index.generation, cached, reads


async def _connect(app: DiscoveryApp, node_id: str, labels: dict[str, str], *, delta: bool) -> Recorder:
    recorder = Recorder(
        str(app.settings.grpc_addr), node_id, agent_metadata(node_id, {"LABELS": labels}), delta=delta
    )
    await recorder.subscribe()
    return recorder


@pytest.fixture
def config(tmp_path: Path) -> Path:
    config = tmp_path / "config"
    config.mkdir()
    shutil.copy(CASE / "config.yaml", config / "config.yaml")
    return config


async def test_the_prediction_is_what_the_push_sends_and_the_live_server_is_untouched(config: Path) -> None:
    async with running(settings_for(config)) as app:
        clients = [
            await _connect(app, PRODUCTPAGE, {"app": "productpage", "version": "v1"}, delta=True),
            await _connect(app, REVIEWS, {"app": "reviews", "version": "v1"}, delta=False),
        ]
        try:
            before = _live_state(app)
            change = ChangeReader().read(yaml.safe_dump(_vs((50, 50))).encode(), app.store)
            assert change.valid, change.errors
            result = await preview(app.preview_sources, change)
            assert _live_state(app) == before, "the preview changed the live server"
            assert result["objects"] == [
                {"kind": "VirtualService", "namespace": "default", "name": "reviews", "change": "update"}
            ]
            predicted = _predicted(result)
            assert set(predicted) == {"productpage-v1.default", "reviews-v1.default"}
            # The weights live in the route configuration of port 9080: that, and only that.
            assert predicted["productpage-v1.default"] == {("rds", "9080", "changed")}
            diff = result["diffs"][result["pushes"][0]["resources"][0]["diff"]]
            assert '-                  "weight": 70' in diff and '+                  "weight": 50' in diff, (
                diff
            )

            write(config / "change.yaml", [_vs((50, 50))])
            seen = {}
            for client in clients:
                changed, _, _ = await client.record()
                seen[client.node[0].split("~")[2]] = changed
            assert seen == predicted
        finally:
            for client in clients:
                await client.close()


async def test_an_invalid_change_is_refused_with_the_webhooks_message(config: Path) -> None:
    async with running(settings_for(config)) as app:
        bad = _vs((50, 50))
        bad["spec"]["http"][0]["retries"]["attempts"] = -1
        body = yaml.safe_dump_all(
            [bad, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {}}]
        )
        change = ChangeReader().read(body.encode(), app.store)
        result = await preview(app.preview_sources, change)
        assert result["valid"] is False
        assert "pushes" not in result
        first, second = result["errors"]
        assert first.startswith("VirtualService default/reviews: configuration is invalid:"), first
        assert "attempts" in first
        assert "only Istio config can be previewed" in second
        # Previews are not admission reviews: the webhook's counters stay as they were.
        assert app.metrics.registry.get_sample_value(
            "galley_validation_failed_total", {"group": "networking.istio.io"}
        ) in (None, 0.0)


async def test_deleting_and_an_unchanged_object(config: Path) -> None:
    async with running(settings_for(config)) as app:
        client = await _connect(app, PRODUCTPAGE, {"app": "productpage", "version": "v1"}, delta=True)
        try:
            same = ChangeReader().read(yaml.safe_dump(_vs((70, 30))).encode(), app.store)
            result = await preview(app.preview_sources, same)
            assert result["objects"][0]["change"] == "unchanged"
            assert result["pushes"] == [] and result["push"] is None
            gone = ChangeReader().read(
                b"apiVersion: networking.istio.io/v1\nkind: DestinationRule\n"
                b"metadata: {name: reviews, namespace: default}\n",
                app.store,
                delete=True,
            )
            result = await preview(app.preview_sources, gone)
            predicted = _predicted(result)["productpage-v1.default"]
            # The subsets' clusters go with the rule; the service's own cluster loses its policy.
            assert ("cds", "outbound|9080|v1|reviews.default.svc.cluster.local", "removed") in predicted
            assert ("cds", "outbound|9080||reviews.default.svc.cluster.local", "changed") in predicted
            (config / "config.yaml").write_text(
                yaml.safe_dump_all(
                    d
                    for d in yaml.safe_load_all((CASE / "config.yaml").read_text())
                    if d and not (d["kind"] == "DestinationRule" and d["metadata"]["name"] == "reviews")
                )
            )
            changed, _, _ = await client.record()
            assert changed == predicted
        finally:
            await client.close()


async def test_over_http_on_the_monitoring_port(config: Path) -> None:
    async with running(settings_for(config)) as app:
        client = await _connect(app, PRODUCTPAGE, {"app": "productpage", "version": "v1"}, delta=True)
        try:
            url = f"http://{app.settings.monitoring_addr}/debug/preview"
            body = yaml.safe_dump(_vs((10, 90))).encode()
            status, answer = await asyncio.to_thread(_post, url, body)
            assert status == 200, answer
            assert _predicted(orjson.loads(answer)) == {
                "productpage-v1.default": {("rds", "9080", "changed")}
            }
            status, answer = await asyncio.to_thread(_post, url, b"{not yaml: [")
            assert status in (200, 400)
            # Not read as false: that would preview writing what was meant to be deleted.
            status, answer = await asyncio.to_thread(_post, url + "?delete=yes", body)
            assert status == 400 and b"delete must be true or false" in answer
        finally:
            await client.close()


async def test_a_body_sent_in_chunks_is_read_whole_and_bounded(config: Path) -> None:
    """Chunked, with pauses: the server sees the body arrive in pieces and must not preview the
    first piece alone (here a comment, which would read as "no objects"), nor take more than
    ``MAX_BODY_BYTES`` without a 413."""

    async def pieces(*parts: bytes) -> Any:
        for part in parts:
            yield part
            await asyncio.sleep(0.05)

    async with running(settings_for(config)) as app:
        client = await _connect(app, PRODUCTPAGE, {"app": "productpage", "version": "v1"}, delta=True)
        try:
            url = f"http://{app.settings.monitoring_addr}/debug/preview"
            padding = b"# " + b"x" * 100_000 + b"\n"
            async with aiohttp.ClientSession() as session:
                body = pieces(padding, yaml.safe_dump(_vs((10, 90))).encode())
                async with session.post(url, data=body) as response:
                    assert response.status == 200, await response.text()
                    assert _predicted(orjson.loads(await response.read())) == {
                        "productpage-v1.default": {("rds", "9080", "changed")}
                    }
                chunk = b"#" * (1024 * 1024 - 1) + b"\n"
                huge = pieces(*[chunk] * (MAX_BODY_BYTES // len(chunk) + 1))
                async with session.post(url, data=huge) as response:
                    assert response.status == 413
        finally:
            await client.close()


async def test_one_preview_at_a_time(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second preview while one runs is turned away (each holds a copy of the config), and the
    next one after it is served."""
    from meshpilot.push import preview_page

    release = asyncio.Event()
    entered = asyncio.Event()

    async def held(*args: Any, **kwargs: Any) -> dict[str, Any]:
        entered.set()
        await release.wait()
        return await preview(*args, **kwargs)

    monkeypatch.setattr(preview_page, "preview", held)
    async with running(settings_for(config)) as app:
        url = f"http://{app.settings.monitoring_addr}/debug/preview"
        body = yaml.safe_dump(_vs((10, 90))).encode()
        first = asyncio.create_task(asyncio.to_thread(_post, url, body))
        await asyncio.wait_for(entered.wait(), 10)
        status, answer = await asyncio.to_thread(_post, url, body)
        assert status == 429, answer
        release.set()
        assert (await first)[0] == 200
        assert (await asyncio.to_thread(_post, url, body))[0] == 200


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/yaml"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_copy_index_is_a_copy() -> None:
    from meshpilot.model.endpoint import Endpoint
    from meshpilot.model.endpoint_index import EndpointIndex, ShardKey

    live = EndpointIndex()
    shard = ShardKey("c", "Kubernetes")
    live.update_service_endpoints(
        shard, "a.default.svc", "default", [Endpoint(address="10.0.0.1", port=80, service_port_name="http")]
    )
    copied = copy_index(live)
    copied.update_service_endpoints(shard, "a.default.svc", "default", [])
    found = live.shards("a.default.svc", "default")
    assert found is not None and len(found.shards[shard]) == 1


_ = time


async def test_problems_are_reported_not_counted(config: Path) -> None:
    from meshpilot.networking.policy_problems import PROBLEMS

    rule = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "ratings", "namespace": "default"},
        "spec": {
            "host": "ratings.default.svc.cluster.local",
            "trafficPolicy": {"tls": {"mode": "SIMPLE", "credentialName": "ratings-ca"}},
        },
    }
    async with running(settings_for(config)) as app:
        client = await _connect(app, PRODUCTPAGE, {"app": "productpage", "version": "v1"}, delta=True)
        try:
            counted = PROBLEMS.count("DestinationRule", "default/ratings")
            change = ChangeReader().read(yaml.safe_dump(rule).encode(), app.store)
            assert change.valid, change.errors
            result = await preview(app.preview_sources, change)
            (problem,) = result["problems"]
            assert (problem["kind"], problem["name"], problem["new"]) == (
                "DestinationRule",
                "default/ratings",
                True,
            )
            assert "credentialName" in problem["message"]
            # The server's own tally did not move: the rule is not in its config.
            assert PROBLEMS.count("DestinationRule", "default/ratings") == counted
            assert ("cds", "outbound|9080||ratings.default.svc.cluster.local", "changed") in _predicted(
                result
            )["productpage-v1.default"]
        finally:
            await client.close()
