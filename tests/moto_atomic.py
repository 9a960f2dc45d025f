"""``moto_server`` with atomic conditional writes: the S3 server the tests and the soak run.

S3 makes a conditional write (``If-None-Match: *``, ``If-Match``) atomic: of two
concurrent PUTs of one Delta log entry, exactly one wins. delta-rs relies on it
to commit (``aws_conditional_put=etag``). moto 5.2.5 checks the condition and
writes the object in two steps on a threaded server, without a lock: 4 clients
PUTting the same new key at once had two winners for 2 of 300 keys. Two
ingesters committing one table at the same version then both "won", and one
commit (its rows and exactly-once markers) was overwritten: the soak's
ingesters later found events below their markers missing and refused to go on
(exit 3; CI, 2026-12-02). Here conditional writes run one at a time; every
other request stays concurrent.
"""

from __future__ import annotations

import threading
from typing import Any

from moto import server
from moto.moto_server.werkzeug_app import DomainDispatcherApplication

_CONDITIONAL_WRITES = threading.Lock()
_dispatch = DomainDispatcherApplication.__call__


def _atomic_conditional_writes(self: DomainDispatcherApplication, environ: dict[str, Any], start_response: Any) -> Any:
    conditional = "HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ
    if conditional and environ.get("REQUEST_METHOD") in ("PUT", "POST"):
        with _CONDITIONAL_WRITES:
            return _dispatch(self, environ, start_response)
    return _dispatch(self, environ, start_response)


if __name__ == "__main__":
    DomainDispatcherApplication.__call__ = _atomic_conditional_writes
    server.main()
