"""Facts of the domain, shared by the readers and the analysis: the communication vocabulary (``vocabulary``,
``vocabulary.toml``), collective names (``collectives``), GPU models (``devices``) and the dataset's derived
columns (``rules``)."""
