"""The serialization patch's names where tests/test_dashboard.py imports them (a test another branch edits): the patch
lives in ``patches`` with the dashboard's other patches; new code imports it from there."""

from overlapviz.dashboards.patches import _ORIGINAL_QUERY as _ORIGINAL  # noqa: F401
from overlapviz.dashboards.patches import _query_properties_with_values, sent, with_buffers  # noqa: F401
from overlapviz.dashboards.patches import install_serialization as install, uninstall_serialization as uninstall  # noqa: F401
