"""Watching a run: console lines, a metrics file, TensorBoard, memory and input watches, the
profiler, the finalize guard. Each is a hook (``mnistflow.training.hooks``)."""
