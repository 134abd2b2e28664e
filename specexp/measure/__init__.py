"""Measure layer: stream requests to an Endpoint, scrape its /metrics, summarise trials."""
