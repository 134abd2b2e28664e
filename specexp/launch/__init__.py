"""Launch layer: turn a Variant into a LaunchPlan, validate it, and run it as a server."""
