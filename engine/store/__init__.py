"""The on-disk model: converters into our model directories and the checks on them."""
