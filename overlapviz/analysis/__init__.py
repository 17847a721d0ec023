"""Analysis: pure functions over dataset tables (no raw traces, no figures). Layer order: ingest -> schema -> analysis -> figures -> CLI/dashboards."""
