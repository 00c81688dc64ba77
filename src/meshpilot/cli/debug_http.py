"""How the commands that ask a running server (``meshpilot preview``, ``meshpilot explain``) reach
its debug port, and how they report a server that cannot be reached or refuses."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import TextIO

#: istiod's monitoring port, where the debug pages are served too.
DEFAULT_SERVER = "http://127.0.0.1:15014"


def ask(url: str, err: TextIO, *, body: bytes | None = None, timeout: float = 30.0) -> bytes | None:
    """The answer to a GET (a POST of ``body`` as YAML); None, with the reason on ``err``, when the
    server cannot be reached or answers with an error status."""
    request = urllib.request.Request(
        url,
        data=body,
        method="GET" if body is None else "POST",
        headers={} if body is None else {"Content-Type": "application/yaml"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer: bytes = response.read()
            return answer
    except urllib.error.HTTPError as e:
        print(f"{url}: HTTP {e.code}: {e.read().decode(errors='replace').strip()}", file=err)
    except (urllib.error.URLError, OSError) as e:
        print(f"{url}: {getattr(e, 'reason', e)}", file=err)
    return None
