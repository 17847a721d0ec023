"""Figure builders: ``(table, *, options) -> HoloViews object``; they draw analysis results and compute no metric.

``charts`` holds the shared style and the configuration grid, ``timeline`` and ``why`` the timelines and the
why-views, ``raster`` the timeline's raster rule (numpy only), ``catalog`` the registry of exportable figures (no
plotting import). Importing this package imports nothing.
"""
