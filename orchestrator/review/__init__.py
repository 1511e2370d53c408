"""The review console: a local web page to review, clear and reject change sets and read
the audit log (``orchestrator review``; the optional extra ``orchestrator[review]``).

:mod:`~orchestrator.review.changes` reads what the pages show with the library only;
:mod:`~orchestrator.review.guard` is the page's own defence (loopback, token, cookie, CSRF,
Host, CSP); :mod:`~orchestrator.review.app` the pages; :mod:`~orchestrator.review.server`
starts it. See docs/review.md.
"""
