"""The Method and output area: the form generated from the method registry, its fields and filters."""
