"""An E2B-compatible server over the project's sessions (docs/e2b.md).

``orchestrator e2b serve``: the REST API the ``e2b`` SDK calls (``E2B_API_URL``) and the
API it calls in a running sandbox (``E2B_SANDBOX_URL``: Connect RPC's process and
filesystem services in JSON, ``/files``, ``/health``). Every E2B sandbox is a session of
the project (:mod:`orchestrator.e2b.sandboxes`); :mod:`orchestrator.e2b.wire` is the pure
encoding, :mod:`orchestrator.e2b.app` the routes, :mod:`orchestrator.e2b.server` the
socket and the key. No module here imports the ``e2b`` package.
"""
