"""Config files that once stalled or bloated the server (issue 21)."""

from __future__ import annotations

LOL = '["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'


def alias_bomb(levels: int = 9) -> str:
    """The classic "billion laughs", inside an EnvoyFilter's patch.value (10^9 values decoded)."""
    names = "abcdefghijklmnop"
    lines = [f"      {names[0]}: &{names[0]} {LOL}"]
    for i in range(1, levels):
        refs = ",".join([f"*{names[i - 1]}"] * 9)
        lines.append(f"      {names[i]}: &{names[i]} [{refs}]")
    return (
        "apiVersion: networking.istio.io/v1alpha3\n"
        "kind: EnvoyFilter\n"
        "metadata: {name: lol, namespace: default}\n"
        "spec:\n"
        "  configPatches:\n"
        "  - applyTo: CLUSTER\n"
        "    patch:\n"
        "      operation: MERGE\n"
        "      value:\n" + "\n".join("  " + line for line in lines) + "\n"
    )
