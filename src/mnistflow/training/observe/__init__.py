"""Watching a run: console lines, a metrics file, TensorBoard. Each is a hook object."""
