"""Models specexp builds itself, so the demo and tests never download from a model hub."""
