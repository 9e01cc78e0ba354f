"""Native kernels: libcmpkern.so (built by the repository's Makefile) and its ctypes binding, _native."""
