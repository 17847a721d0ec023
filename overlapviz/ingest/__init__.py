"""Ingest raw traces (Chrome/Kineto JSON, rocprof) into the canonical Parquet dataset."""
