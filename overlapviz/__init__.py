"""overlapviz: computation-communication overlap experiments, trace datasets, metrics and dashboards."""

__version__ = "0.1.0"
