"""python -m mnistflow ... (the same as the ``mnistflow`` command)."""
from .cli import main

raise SystemExit(main())
