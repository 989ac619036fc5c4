"""A real tunix RLCluster: meshes, optimizers with the NaN guard, step timing."""
