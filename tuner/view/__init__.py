"""A sweep directory read back: analysis, the report (document, plots), TensorBoard."""
