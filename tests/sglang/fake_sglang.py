"""Stand-in for ``python -m sglang.launch_server`` and ``sglang_router.launch_router`` in tests.

Accepts their command lines, records what it was given (argv and CUDA_VISIBLE_DEVICES) in
``$FAKE_SGLANG_RECORD/<port>.json``, and serves the bundled engine (model=tiny, CPU) on
``--host``/``--port``, so the launcher's start / health / stop path runs for real.
``--fake-exit N`` exits with status N at once (a server that dies during start-up).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main() -> None:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--fake-exit", type=int, default=None)
    args, _ = ap.parse_known_args()
    record = os.environ.get("FAKE_SGLANG_RECORD")
    if record:
        with open(os.path.join(record, f"{args.port}.json"), "w") as f:
            json.dump(
                {
                    "argv": sys.argv[1:],
                    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                },
                f,
            )
    if args.fake_exit is not None:
        print(f"fake sglang: exiting with {args.fake_exit} as asked", flush=True)
        sys.exit(args.fake_exit)
    from systems.engine.server import main as serve

    serve(["--host", args.host, "--port", str(args.port), "model=tiny", "device=cpu"])


if __name__ == "__main__":
    main()
