"""Resource quantities come out as Go's resource.Quantity writes them."""

from __future__ import annotations

import pytest

from meshpilot.webhooks.inject.config import InjectionError
from meshpilot.webhooks.inject.quantity import canonical_quantity


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("4000m", "4"),
        ("1500m", "1500m"),
        ("0.5", "500m"),
        ("100m", "100m"),
        ("1024Mi", "1Gi"),
        ("1.5Gi", "1536Mi"),
        ("512Mi", "512Mi"),
        ("2000M", "2G"),
        ("1e3", "1e3"),
        ("0", "0"),
        ("0.1Ki", "102400m"),
    ],
)
def test_canonical_form(given: str, canonical: str) -> None:
    assert canonical_quantity(given, "x") == canonical


@pytest.mark.parametrize("bad", ["", "lots", "1.2.3", "5 Gi", "1Zi"])
def test_bad_quantity_is_an_error(bad: str) -> None:
    with pytest.raises(InjectionError, match="is not a resource quantity"):
        canonical_quantity(bad, "annotation sidecar.istio.io/proxyCPU")
