"""Data layer: source files -> prep -> records -> loader."""
