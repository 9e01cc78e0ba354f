"""Backends implement base.Backend: numpy_ref (the specification) and cuda (libcmpkern.so)."""
