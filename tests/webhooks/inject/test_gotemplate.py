"""The Go text/template engine: expected outputs worked out from Go's documented semantics."""

from __future__ import annotations

from typing import Any

import pytest

from meshpilot.webhooks.inject.gotemplate import StrMap, Template, TemplateError

DATA: dict[str, Any] = {
    "S": "str",
    "E": "",
    "N": 3,
    "F": 1.5,
    "Zero": 0,
    "T": True,
    "L": ["a", "b", "c"],
    "Empty": [],
    "M": {"z": 26, "a": 1, "m": 13},
    "Nested": {"Inner": {"Deep": "d"}},
    "Nil": None,
    "Labels": StrMap({"app": "shop"}),
}


def run(text: str, data: Any = None) -> str:
    return Template("t", text).execute(DATA if data is None else data)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # text, fields, trimming and comments
        ("plain", "plain"),
        ("{{ .S }}", "str"),
        ("{{ .Nested.Inner.Deep }}", "d"),
        ("a  {{- .S -}}  b", "astrb"),
        ("a {{- .S }} b", "astr b"),
        ("a\n\n{{- /* a comment */ -}}\n\nb", "ab"),
        ("a{{/* comment */}}b", "ab"),
        ("{{ 3 -}} < {{- 4 }}", "3<4"),
        ("{{ -3 }}", "-3"),
        # missing keys and nil, as Go prints them for map[string]interface{}
        ("{{ .Missing }}", "<no value>"),
        ("{{ .Missing.Deeper }}", "<no value>"),
        ("{{ .Nil }}", "<no value>"),
        ('{{ index .Labels "nope" }}|', "|"),
        ('{{ index .M "nope" }}', "<no value>"),
        # literals
        ('{{ "a\\tb\\u00e9\\x41" }}', "a\tbéA"),
        ("{{ `raw\\n` }}", "raw\\n"),
        ("{{ 'a' }} {{ 0x1F }} {{ 1_000 }} {{ 2.50 }} {{ 1e3 }}", "97 31 1000 2.5 1000"),
        ("{{ true }} {{ false }}", "true false"),
        # printing of composite values
        ("{{ .L }} {{ .M }}", "[a b c] map[a:1 m:13 z:26]"),
        ("{{ .F }} {{ 1000000.0 }}", "1.5 1e+06"),
        # if / else if / else, truthiness
        ("{{ if .T }}y{{ end }}", "y"),
        ("{{ if .E }}y{{ else }}n{{ end }}", "n"),
        ("{{ if .Zero }}a{{ else if .Empty }}b{{ else if .M }}c{{ else }}d{{ end }}", "c"),
        ("{{ if .Missing }}a{{ else if .Nil }}b{{ else }}c{{ end }}", "c"),
        ("{{ if and .T .N }}{{ and .T .N }}{{ end }} {{ or .E .Zero .S }} {{ or .E .Zero }}", "3 str 0"),
        ("{{ if not .L }}x{{ else }}y{{ end }}", "y"),
        # with
        ("{{ with .Nested.Inner }}{{ .Deep }}{{ end }}", "d"),
        ("{{ with .Missing }}x{{ else }}none{{ end }}", "none"),
        ("{{ with .E }}x{{ else with .S }}{{ . }}{{ end }}", "str"),
        ("{{ with $x := .S }}{{ $x }}{{ . }}{{ end }}", "strstr"),
        # range
        ("{{ range .L }}{{ . }},{{ end }}", "a,b,c,"),
        ("{{ range $i, $v := .L }}{{ $i }}={{ $v }} {{ end }}", "0=a 1=b 2=c "),
        ("{{ range $k, $v := .M }}{{ $k }}{{ $v }}{{ end }}", "a1m13z26"),
        ("{{ range $v := .M }}{{ $v }} {{ end }}", "1 13 26 "),
        ("{{ range .Empty }}x{{ else }}empty{{ end }}", "empty"),
        ("{{ range .Missing }}x{{ else }}none{{ end }}", "none"),
        ("{{ range 3 }}{{ . }}{{ end }}", "012"),
        ('{{ range .L }}{{ if eq . "b" }}{{ continue }}{{ end }}{{ . }}{{ end }}', "ac"),
        ('{{ range .L }}{{ if eq . "b" }}{{ break }}{{ end }}{{ . }}{{ end }}', "a"),
        ("{{ range .L }}{{ $.S }}{{ end }}", "strstrstr"),
        # variables: declaration, assignment, scope
        ("{{ $x := 1 }}{{ $x }}{{ $x = 2 }}{{ $x }}", "12"),
        ("{{ $x := 1 }}{{ if .T }}{{ $x = 2 }}{{ $x := 3 }}{{ $x }}{{ end }}{{ $x }}", "32"),
        ("{{ $x := .L }}{{ range $x }}{{ end }}{{ len $x }}", "3"),
        ("{{ $n := 0 }}{{ range .L }}{{ $n = 1 }}{{ end }}{{ $n }}", "1"),
        # pipelines, parentheses, chains
        ('{{ .S | printf "%s!" }}', "str!"),
        ('{{ "x" | printf "%s-%s" "a" }}', "a-x"),
        ('{{ (index .Nested "Inner").Deep }}', "d"),
        ("{{ $n := .Nested }}{{ $n.Inner.Deep }}", "d"),
        ('{{ len .S }} {{ len .L }} {{ len .M }} {{ len "é" }}', "3 3 3 2"),
        ('{{ index .L 1 }} {{ index .M "z" }} {{ index .Nested "Inner" "Deep" }}', "b 26 d"),
        ("{{ slice .S 1 }} {{ slice .L 1 2 }}", "tr [b]"),
        # comparisons
        ('{{ eq .S "x" "str" }} {{ eq .N 3 }} {{ ne .N 4 }} {{ eq .Missing "x" }}', "true true true false"),
        ('{{ lt 1 2 }} {{ le 2 2 }} {{ gt .F 1 }} {{ ge "b" "a" }}', "true true true true"),
        # print functions
        ('{{ print "a" 1 2 "b" }}', "a1 2b"),
        ('{{ println "a" 1 }}', "a 1\n"),
        (
            '{{ printf "%d|%5d|%-4s|%05.1f|%x|%X|%o" 42 7 "ab" 3.14159 255 255 8 }}',
            "42|    7|ab  |003.1|ff|FF|10",
        ),
        (
            '{{ printf "%v %q %t %s %T %T" .L "q\\"" true .N .S .M }}',
            '[a b c] "q\\"" true %!s(int=3) string map[string]interface {}',
        ),
        ('{{ printf "%s %%" }}', "%!s(MISSING) %"),
        ('{{ printf "%s" "a" "b" }}', "a%!(EXTRA string=b)"),
        ('{{ printf "%e %g %.2f" 1234.5 0.00001 2.0 }}', "1.234500e+03 1e-05 2.00"),
        # escaping functions
        ('{{ html "<a href=\\"x\\">&\'" }}', "&lt;a href=&#34;x&#34;&gt;&amp;&#39;"),
        ('{{ js "it\'s <b>" }}', "it\\'s \\u003Cb\\u003E"),
        ('{{ urlquery "a b&c=d" }}', "a+b%26c%3Dd"),
        # define, template, block
        ('{{ define "T" }}[{{ . }}]{{ end }}{{ template "T" .S }}{{ template "T" }}', "[str][<no value>]"),
        ('{{ block "B" .N }}<{{ . }}>{{ end }}', "<3>"),
        ('{{ define "T" }}{{ $x := 1 }}{{ $ }}{{ end }}{{ template "T" .N }}', "3"),
    ],
)
def test_go_semantics(text: str, expected: str) -> None:
    assert run(text) == expected


def test_call_invokes_a_function_value() -> None:
    assert run("{{ call .F 2 }}", {"F": lambda x: x * 21}) == "42"


def test_custom_functions_and_overrides() -> None:
    funcs = {"double": lambda x: x * 2, "len": lambda x: "overridden"}
    assert Template("t", "{{ double 4 }} {{ 3 | double }} {{ len 1 }}", funcs).execute({}) == "8 6 overridden"


def test_and_or_short_circuit() -> None:
    def boom() -> str:
        raise AssertionError("evaluated")

    template = Template("t", "{{ or .S boom }} {{ and .E boom }}|", {"boom": boom})
    assert template.execute({"S": "s", "E": ""}) == "s |"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a\nb\n{{ if .T }}", "template: t:3: unexpected EOF"),
        ("{{ end }}", "template: t:1: unexpected {{end}}"),
        ("{{ nosuch 1 }}", 'template: t:1: function "nosuch" not defined'),
        ("\n{{ $x }}", 'template: t:2: undefined variable "$x"'),
        ("{{ .S", "template: t:1: unclosed action"),
        ('{{ "abc }}', "unterminated quoted string"),
        ("{{ /* x */ }}", "unrecognized character in action"),
        ("{{ break }}", "{{break}} outside {{range}}"),
        ("{{ range .L }}{{ else if .T }}{{ end }}", "unexpected"),
        ("{{ (1) 2 }}", "can't give argument to non-function"),
    ],
)
def test_parse_errors_name_template_and_line(text: str, message: str) -> None:
    with pytest.raises(TemplateError) as err:
        run(text)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a\n\n{{ .S.Field }}", "template: t:3: can't evaluate field Field in type string"),
        ("{{ .Nil.Field }}", "nil pointer evaluating interface {}.Field"),
        ("{{ eq .S 1 }}", "error calling eq: incompatible types for comparison"),
        ("{{ lt .L 1 }}", "error calling lt: invalid type for comparison"),
        ("{{ index .L 5 }}", "error calling index: index out of range: 5"),
        ("{{ len .N }}", "error calling len: len of type int"),
        ('{{ template "nope" }}', 'no such template "nope"'),
        ("{{ range .S }}{{ end }}", "range can't iterate over str"),
        ('{{ define "loop" }}{{ template "loop" }}{{ end }}{{ template "loop" }}', "maximum template depth"),
    ],
)
def test_execution_errors_name_template_and_line(text: str, message: str) -> None:
    with pytest.raises(TemplateError) as err:
        run(text)
    assert message in str(err.value)


def test_errors_inside_a_defined_template_name_it() -> None:
    text = '{{ define "inner" }}\n{{ .S.X }}{{ end }}{{ template "inner" . }}'
    with pytest.raises(TemplateError, match=r"template: inner:2: can't evaluate field X"):
        run(text)
