"""Files for readers outside overlapviz: figures as PNG/SVG/PDF/HTML (``render``, drawn by the headless chromium
of ``browser`` from the tables ``source`` reads) and a run as a Perfetto trace (``perfetto``). Importing this package
imports nothing."""
