"""python -m mnistflow ... (the same as the ``mnistflow`` command)."""
from mnistflow.cli import main

raise SystemExit(main())
