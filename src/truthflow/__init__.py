"""truthflow: the science behind the workflow (data, models, generation, labels, pathways, depth, plots)."""

__version__ = "0.1.0"
