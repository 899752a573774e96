"""The environment spec: models (model), file reading (source), rules, and loading (load)."""
