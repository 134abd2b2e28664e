"""Running variants: one variant's life (``variant``), the order of many (``schedule``), a
whole sweep with resume (``sweep``). ``sweep`` and ``tune`` are loops over ``run_variant``."""
