"""Ensembles: many trajectories of one model, cut into batches and run locally or on Dask."""
