"""Sequence state, generation and (later) scheduling."""
