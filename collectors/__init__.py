"""Collectors: run the paper's overlap experiments and record traces (installed as ``overlapviz.collectors``)."""
