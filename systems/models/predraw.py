"""Draw presets' random weights into the weight cache ahead of their first server.

    DHS_WEIGHT_CACHE=/tmp/dhs-weights python -m systems.models.predraw dsv41_h200 [glm53_h200 ...]

A server draws its weights on the CPU (one seeded generator, the same on every device) and
saves them in ``DHS_WEIGHT_CACHE``; later servers of the same weights load the file. dsv41_h200's
30 GB take minutes to draw, device time on a GPU machine whose GPU waits meanwhile. This draws
them beforehand, on the CPU alone, into the file the server loads (the dtype is the one a model
on ``--device`` has: bfloat16 on a GPU): `benchmarks/gpu_batch.sh` runs it beside a batch's
other items (``DHS_PREDRAW``). A preset already in the cache is left as it is.
"""

from __future__ import annotations

import argparse
import logging
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="model presets (conf/model/<name>.yaml)")
    ap.add_argument(
        "--device", default="cuda", help="the device whose dtype the weights take (default: cuda)"
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    from systems.engine.config import compose, model_config_from
    from systems.models.sparse_model import predraw

    for name in args.models:
        t0 = time.perf_counter()
        cfg = model_config_from(compose([f"model={name}"]).model, args.device)
        path, drawn = predraw(cfg)
        what = "drawn" if drawn else "already cached"
        print(f"[predraw] {name}: {what} in {time.perf_counter() - t0:.1f} s -> {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
