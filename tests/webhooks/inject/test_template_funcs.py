"""Sprig's functions and Istio's template functions, as injection templates call them."""

from __future__ import annotations

from typing import Any

import pytest

from meshpilot.webhooks.inject.gotemplate import StrMap, Template
from meshpilot.webhooks.inject.gotemplate.sprig import FUNCS as SPRIG
from meshpilot.webhooks.inject.template import FUNCS
from meshpilot.webhooks.inject.template_data import KubeObject, ProtoMessage, json_name
from meshpilot.webhooks.inject.template_funcs import go_duration, injection_funcs

DATA: dict[str, Any] = {
    "S": "  Hello World  ",
    "E": "",
    "L": ["b", "a", "b"],
    "M": {"b": 2, "a": 1},
    "Ann": StrMap({"x": "1", "y": "2"}),
    "N": 7,
    "Nested": {"k": {"v": [1, 2]}},
}


def run(text: str, data: Any = None, funcs: Any = None) -> str:
    return Template("t", text, funcs or FUNCS).execute(DATA if data is None else data)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '{{ .E | default "d" }} {{ .Missing | default "d" }} {{ "v" | default "d" }} {{ 0 | default 5 }}',
            "d d v 5",
        ),
        ("{{ empty .E }} {{ empty .L }} {{ empty 0 }} {{ empty .Missing }}", "true false true true"),
        ('{{ coalesce .E .Missing "c" }} {{ ternary "y" "n" true }} {{ ternary "y" "n" false }}', "c y n"),
        ('{{ .E | quote }} {{ 3 | quote }} {{ squote "a" }}', '"" "3" \'a\''),
        ('{{ quote "a\\"b" }}', '"a\\"b"'),
        (
            '{{ trim .S }}|{{ lower "AB" }}{{ upper "cd" }}|{{ title "hello wide world" }}',
            "Hello World|abCD|Hello Wide World",
        ),
        ('{{ trimPrefix "a-" "a-b" }} {{ trimSuffix "-b" "a-b" }} {{ trimAll "-_." "--x.y_." }}', "b a x.y"),
        ('{{ hasPrefix "a" "abc" }} {{ hasSuffix "c" "abc" }} {{ contains "b" "abc" }}', "true true true"),
        ('{{ trunc 3 "abcdef" }} {{ trunc -2 "abcdef" }} {{ trunc 10 "ab" }}', "abc ef ab"),
        ('{{ replace "a" "o" "banana" }} {{ join "," .L }} {{ splitList "," "a,b" }}', "bonono b,a,b [a b]"),
        ('{{ $s := split "." "a.b" }}{{ $s._0 }}{{ $s._1 }}', "ab"),
        (
            '{{ list 1 "a" }} {{ append .L "c" }} {{ first .L }} {{ last .L }} '
            "{{ uniq .L }} {{ sortAlpha .L }}",
            "[1 a] [b a b c] b b [b a] [a b b]",
        ),
        ('{{ has "a" .L }} {{ has "z" .L }} {{ until 3 }}', "true false [0 1 2]"),
        (
            '{{ $d := dict "a" 1 "b" }}{{ $d }} {{ hasKey $d "b" }} {{ keys $d | sortAlpha }}',
            "map[a:1 b:] true [a b]",
        ),
        ('{{ $d := dict "a" 1 }}{{ $_ := set $d "b" 2 }}{{ $_ := unset $d "a" }}{{ $d }}', "map[b:2]"),
        ('{{ pick .M "a" }} {{ omit .M "a" }}', "map[a:1] map[b:2]"),
        ('{{ $d := dict "a" 1 }}{{ merge $d (dict "a" 9 "b" 2) }}', "map[a:1 b:2]"),
        ("{{ $c := deepCopy .Nested }}{{ $c.k.v }}", "[1 2]"),
        (
            '{{ kindIs "map" .M }} {{ kindIs "slice" .L }} {{ typeOf .N }} {{ typeOf .S }}',
            "true true int string",
        ),
        (
            '{{ int "42" }} {{ int 3.9 }} {{ atoi "x" }} {{ toString 5 }} {{ add 1 2 3 }} {{ sub 5 2 }}',
            "42 3 0 5 6 3",
        ),
        ("{{ mul 2 3 4 }} {{ div 7 2 }} {{ mod 7 3 }} {{ max 1 9 3 }} {{ min 4 2 8 }}", "24 3 1 9 2"),
        ('{{ b64enc "hi" }} {{ b64dec "aGk=" }}', "aGk= hi"),
        ('{{ regexMatch "^a.c$" "abc" }} {{ regexReplaceAll "(b+)" "abbc" "<${1}>" }}', "true a<bb>c"),
        (
            '{{ toJson .M }} {{ toJson .L }} {{ toJson "<&>" }}',
            '{"a":1,"b":2} ["b","a","b"] "\\u003c\\u0026\\u003e"',
        ),
        ("{{ toPrettyJson .M }}", '{\n  "a": 1,\n  "b": 2\n}'),
        ('{{ (fromJson "{\\"a\\": [1]}").a }}', "[1]"),
        # Istio's versions replace sprig's: toYaml keeps its newline, indent skips the first line.
        ("{{ toYaml .M }}", "a: 1\nb: 2\n"),
        ('{{ indent 2 "a\\nb" }}|{{ nindent 2 "a\\nb" }}', "a\n  b|\n  a\n  b"),
        ("{{ toYaml .Nested | indent 4 }}", "k:\n      v:\n      - 1\n      - 2\n    "),
        # Istio's own
        ('{{ isset .Ann "x" }} {{ isset .Ann "z" }}', "true false"),
        ('{{ valueOrDefault .E "d" }} {{ valueOrDefault "v" "d" }} {{ valueOrDefault .Missing 3 }}', "d v 3"),
        (
            '{{ excludeInboundPort 15020 "80,81" }} {{ excludeInboundPort "15020" "15020" }}',
            "80,81,15020 15020",
        ),
        ("{{ toJSON .Ann }} {{ toJSON nil }}", '{"x":"1","y":"2"} {}'),
        (
            '{{ omit .Ann "x" }} {{ strdict "a" "b" "c" }} {{ toJsonMap .Ann (strdict "x" "9") }}',
            'map[y:2] map[a:b c:] {"x":"9","y":"2"}',
        ),
        ('{{ mergeMaps .Ann (strdict "z" "3") }}', "map[x:1 y:2 z:3]"),
        (
            '{{ structToJSON .M }} {{ structToJSON nil }} {{ (fromJSON "[1,2]") }} {{ fromJSON "bad" }}',
            '{"a":1,"b":2} {} [1 2] {}',
        ),
        ('{{ directory "/a/b/c.txt" }} {{ toLower "AbC" }} {{ kubevirtInterfaces "x" }}', "/a/b/ abc x"),
        (
            '{{ appendMultusNetwork "" "istio-cni" }}|{{ appendMultusNetwork "a" "istio-cni" }}|'
            '{{ appendMultusNetwork "istio-cni" "istio-cni" }}',
            "istio-cni|a, istio-cni|istio-cni",
        ),
        (
            '{{ appendMultusNetwork "[{\\"name\\": \\"a\\"}]" "ns/istio-cni" }}',
            '[{"name": "a"}, {"name": "istio-cni", "namespace": "ns"}]',
        ),
        (
            '{{ formatDuration "90s" }} {{ formatDuration "0.5s" }} {{ formatDuration "7200s" }}',
            "1m30s 500ms 2h0m0s",
        ),
        ("{{ toYaml (omitNil .WithNil) }}", "a:\n  c: 1\n"),
    ],
)
def test_functions(text: str, expected: str) -> None:
    data = dict(DATA, WithNil={"a": {"b": None, "c": 1}, "d": None})
    assert run(text, data) == expected


def test_env_reads_the_environment_it_is_given() -> None:
    funcs = {**SPRIG, **injection_funcs({"SET": "v"})}
    assert run('{{ env "SET" "d" }} {{ env "UNSET" "d" }}', funcs=funcs) == "v d"


def test_container_ports_and_annotations_on_kubernetes_objects() -> None:
    spec = KubeObject(
        {
            "containers": [
                {"name": "app", "ports": [{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP"}]},
                {"name": "istio-proxy", "ports": [{"containerPort": 15090}]},
            ]
        },
        "v1.PodSpec",
    )
    meta = KubeObject({"annotations": {"a": "1"}}, "v1.ObjectMeta")
    data = {"Spec": spec, "ObjectMeta": meta}
    assert run("{{ includeInboundPorts .Spec.Containers }}", data) == "80,15090"
    assert run("{{ applicationPorts .Spec.Containers }}", data) == "80"
    assert run('{{ annotation .ObjectMeta "a" "d" }} {{ annotation .ObjectMeta "b" 15 }}', data) == "1 15"


def test_proto_messages() -> None:
    proxy = ProtoMessage({"interceptionMode": "TPROXY", "concurrency": 2}, "v1alpha1.ProxyConfig")
    data = {"ProxyConfig": proxy}
    assert (
        run("{{ .ProxyConfig.InterceptionMode }} {{ .ProxyConfig.Concurrency.GetValue }}", data) == "TPROXY 2"
    )
    assert run("{{ protoToJSON .ProxyConfig }}", data) == '{"interceptionMode":"TPROXY","concurrency":2}'
    assert run("{{ if .ProxyConfig.GetTracing }}t{{ else }}none{{ end }}", data) == "none"


@pytest.mark.parametrize(
    ("go", "json"),
    [
        ("ServiceAccountName", "serviceAccountName"),
        ("APIVersion", "apiVersion"),
        ("UID", "uid"),
        ("HostIPC", "hostIPC"),
    ],
)
def test_json_names(go: str, json: str) -> None:
    assert json_name(go) == json


@pytest.mark.parametrize(
    ("nanos", "text"),
    [(0, "0s"), (1_500_000_000, "1.5s"), (90 * 10**9, "1m30s"), (3600 * 10**9, "1h0m0s"), (1500, "1.5µs")],
)
def test_go_duration(nanos: int, text: str) -> None:
    assert go_duration(nanos) == text
