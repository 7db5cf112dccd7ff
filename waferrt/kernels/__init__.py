"""Library kernels of the programming model (waferrt.fabric.kernel.Cores): the mesh GEMMs."""
