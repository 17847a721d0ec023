"""The dataset: its Arrow schema and Parquet layout (``schema``) and its directory on disk (``outdir``).

Every later layer reads and writes datasets through these two modules; they import nothing else of overlapviz.
"""
