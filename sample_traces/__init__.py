"""Real traces recorded on real GPUs, shipped with overlapviz (see README.md here)."""
