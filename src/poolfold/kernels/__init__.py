"""numba kernels: plain loops over planes, one module per kind of work. They never validate."""
