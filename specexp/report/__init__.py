"""Report layer: what people look at (plans, tables)."""
