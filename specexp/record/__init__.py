"""Record layer: result models, result files, MLflow."""
