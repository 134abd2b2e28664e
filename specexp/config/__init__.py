"""Config layer: typed schema, Hydra composition, sweep expansion into Variants."""
