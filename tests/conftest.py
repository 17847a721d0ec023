"""Shared by the test modules."""

import sys

import pytest
from hypothesis import settings

# no per-example deadline: it is a timing assertion (200 ms by default), and CI's loaded 2 cores and .ci/sanitize's
# AddressSanitizer build pass it at random (timings belong in benchmarks/)
settings.register_profile("overlapviz", deadline=None)
settings.load_profile("overlapviz")


@pytest.fixture(autouse=True)
def _hang_net(request):
    """A test of a module that sets ``HANG_S`` and runs past it dumps every thread's stack and ends the run, so a
    hang cannot eat CI's time (pytest's own ``faulthandler_timeout``, when given, takes precedence)."""
    limit = getattr(request.module, "HANG_S", None)
    if limit is None or request.config.getini("faulthandler_timeout"):
        yield
        return
    import faulthandler

    faulthandler.dump_traceback_later(limit, exit=True, file=sys.__stderr__)
    yield
    faulthandler.cancel_dump_traceback_later()
