"""Runnable demos: ``python -m demos.grid_encoders_2d`` / ``python -m demos.grid_encoders_3d``."""
