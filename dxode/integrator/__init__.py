"""The lane integrator: one step loop for every path, its working set of lanes and dense output."""
