"""Library kernels of the programming model (waferrt.Context, the kernel context): the mesh GEMMs."""
