"""A plug-in with a bug in its own code."""
import raybench.data

DATASET_FACTORY = raybench.data.no_such_builder
