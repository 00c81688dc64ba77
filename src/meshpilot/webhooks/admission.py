"""AdmissionReview envelopes: reading a review, and answering it in the caller's apiVersion.

istiod decodes both admission.k8s.io/v1 and v1beta1 reviews and answers in
the version it was sent; a body that is JSON but not a review still gets a
review back (HTTP 200) that denies with a message, so the API server shows
the reason rather than a transport error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

from meshpilot.bounded_logs import DENIAL_CHARS, STATUS_CHARS, clip, truncate
from meshpilot.input_limits import InputRejected, check_nesting

log = logging.getLogger(__name__)

#: A handler of one review path: the ``request`` of a review in, the ``response`` out.
ReviewHandler = Callable[[dict[str, Any]], dict[str, Any]]

ADMISSION_GROUP = "admission.k8s.io"
API_VERSIONS = frozenset({f"{ADMISSION_GROUP}/v1", f"{ADMISSION_GROUP}/v1beta1"})
REVIEW_KIND = "AdmissionReview"


_STRING_FIELDS = ("uid", "operation", "namespace", "name")
_OBJECT_FIELDS = ("kind", "resource", "userInfo")


class ReviewDecodeError(ValueError):
    """A body that is not an AdmissionReview this server understands."""


def denied(message: str) -> dict[str, Any]:
    """A response refusing the request, as istiod's toAdmissionResponse builds it.

    The message goes in ``status`` (Go's ``Result`` field is ``json:"status"``): the API server shows
    that to the user, and ignores a ``result`` key (shown by a real kube-apiserver calling /validate).
    """
    return {"allowed": False, "status": {"message": truncate(message, DENIAL_CHARS)}}


def decode_review(body: bytes) -> tuple[str, dict[str, Any]]:
    """(apiVersion, request) of a review body; ReviewDecodeError says what is wrong."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise ReviewDecodeError(f"could not decode body: {err}") from None
    if not isinstance(data, dict):
        raise ReviewDecodeError("could not decode body: not a JSON object")
    try:
        # Everything after this walks the object recursively (decoding, templates, the patch diff).
        check_nesting(data, "could not decode body")
    except InputRejected as err:
        raise ReviewDecodeError(str(err)) from None
    api_version = data.get("apiVersion")
    kind = data.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str) or not api_version or not kind:
        raise ReviewDecodeError("could not decode body: Object 'Kind' is missing in the body")
    if kind != REVIEW_KIND or api_version not in API_VERSIONS:
        raise ReviewDecodeError(
            f"could not decode body: no kind {kind!r} is registered for version {api_version!r}"
        )
    request = data.get("request")
    if not isinstance(request, dict):
        raise ReviewDecodeError("could not decode object: the review has no request")
    # Go's decoder refuses a field of the wrong JSON type; so does this.
    for key in _STRING_FIELDS:
        if key in request and not isinstance(request[key], str):
            raise ReviewDecodeError(f"could not decode body: request.{key} must be a string")
    for key in _OBJECT_FIELDS:
        if key in request and not isinstance(request[key], dict):
            raise ReviewDecodeError(f"could not decode body: request.{key} must be an object")
    return api_version, request


def answer(body: bytes, handler: ReviewHandler) -> bytes:
    """The JSON review answering ``body``; never raises for anything a caller can send.

    A handler that raises is a bug, but the caller still gets a denial naming
    it instead of a dropped connection.
    """
    try:
        api_version, request = decode_review(body)
    except ReviewDecodeError as err:
        # istiod leaves apiVersion and kind empty when it could not read the review.
        return orjson.dumps({"response": denied(str(err))})
    try:
        response = handler(request)
    except Exception as err:  # reported to the caller, see above
        log.exception("admission handler failed")
        response = denied(clip(f"internal error: {type(err).__name__}: {err}", STATUS_CHARS))
    uid = request.get("uid")
    response = {"uid": uid if isinstance(uid, str) else "", **response}
    return orjson.dumps({"apiVersion": api_version, "kind": REVIEW_KIND, "response": response})
