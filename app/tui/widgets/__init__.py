"""The dashboard's own widgets, one module each."""
