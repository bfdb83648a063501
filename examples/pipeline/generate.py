"""Writes the pipeline's events as JSON files, one per micro-batch and stream (some keys NULL, some clicks
and conversions without an impression or click before them).

    python generate.py [directory]    (default: /tmp/umjoin-attribution/events, as spark-pipeline.yml reads)
"""

from __future__ import annotations

import datetime
import json
import random
import sys
from pathlib import Path

DEFAULT = Path("/tmp/umjoin-attribution/events")


def generate(root: Path, micro_batches: int = 4, seed: int = 3) -> None:
    rng = random.Random(seed)
    start = datetime.datetime(2026, 5, 1)
    for batch in range(micro_batches):
        rows: dict[str, list[dict[str, object]]] = {"impressions": [], "clicks": [], "conversions": []}
        for i in range(25):
            shown = start + datetime.timedelta(minutes=10 * batch + rng.randint(0, 9))
            impression, user, ad = batch * 100 + i, rng.choice([0, 1, 2, 3, 4, None]), rng.randint(0, 2)
            rows["impressions"].append({"imp_id": impression, "user_id": user, "ad_id": ad, "imp_time": shown.isoformat()})
            if rng.random() < 0.7:
                clicked = shown + datetime.timedelta(minutes=rng.choice([1, 5, 30, 90]))  # 90: past the hour
                click_user = user if rng.random() < 0.9 else rng.randint(0, 4)
                rows["clicks"].append({"click_id": impression, "click_user": click_user, "click_ad": ad,
                                       "click_time": clicked.isoformat()})
                if rng.random() < 0.6:
                    converted = clicked + datetime.timedelta(minutes=rng.choice([2, 20, 150]))  # 150: past two hours
                    rows["conversions"].append({"conv_id": impression, "conv_click": impression,
                                                "conv_time": converted.isoformat()})
        for name, events in rows.items():
            (root / name).mkdir(parents=True, exist_ok=True)
            (root / name / f"batch-{batch:02d}.json").write_text("".join(json.dumps(e) + "\n" for e in events))


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
