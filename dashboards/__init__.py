"""Panel dashboards composed from overlapviz figure builders (installed as ``overlapviz.dashboards``)."""
