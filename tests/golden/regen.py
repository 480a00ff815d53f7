"""Regenerate the golden greedy tokens from the resident backend (the oracle).

    .venv/bin/python -m tests.golden.regen

Only rerun when the model itself changes on purpose; every KV backend is held to this file.
"""

import json
from pathlib import Path

from tests.helpers import golden_prompts, make_engine, run_greedy

GOLDEN = Path(__file__).with_name("tiny_greedy.json")
MODELS = ("tiny", "tiny_dsv")
MAX_NEW = 24


def main() -> None:
    out = {"max_new_tokens": MAX_NEW, "prompts": golden_prompts(), "outputs": {}}
    for m in MODELS:
        eng = make_engine(f"model={m}", "system=resident", "hardware.kv_pool_gib=0.01")
        out["outputs"][m] = run_greedy(eng, out["prompts"], MAX_NEW)
    GOLDEN.write_text(json.dumps(out) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
