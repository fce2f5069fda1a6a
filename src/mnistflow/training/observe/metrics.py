"""The run's metrics file: one JSON object per line (``metrics.jsonl``), appended as it goes."""
from __future__ import annotations

import json
from pathlib import Path


class MetricsFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._f = open(self.path, "a", buffering=1)  # line-buffered: a crash loses no line

    def write(self, kind: str, step: int, logs: dict) -> None:
        rec = {"kind": kind, "step": step}
        rec.update({k: v for k, v in logs.items() if isinstance(v, (int, float, str, bool))})
        self._f.write(json.dumps(rec) + "\n")

    def on_train_log(self, step: int, logs: dict) -> None:
        self.write("train", step, logs)

    def on_eval(self, step: int, logs: dict) -> None:
        self.write(logs["split"], step, logs)

    def close(self) -> None:
        self._f.close()


def read_metrics(path: str | Path) -> list[dict]:
    """All records of a metrics file (a torn last line from a crash is skipped)."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
