#!/usr/bin/env bash
# Build .venv-sglang (SGLang in its own environment) and run the SGLang tests.
#
#   bash scripts/sglang_env.sh               # build once (about 11 GB, minutes), then test
#   bash scripts/sglang_env.sh --build-only  # only build
#   bash scripts/sglang_env.sh -k router     # extra arguments go to pytest
#
# sglang 0.5.23 pins torch 2.14.1 (a CUDA build) and cannot share .venv (torch 2.13, CPU). On
# the CPU machines torch 2.14.1 and torchvision 0.29.1 install from local disk. Two test runs:
#   1. in .venv-sglang: SGLang's own parsers accept every argument list the adapter builds;
#   2. in .venv (when present): launch/attach against the bundled server, and SGLang's
#      bench_serving (from .venv-sglang) counting the same requests and tokens as our records.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv-sglang
PY=$VENV/bin/python
STAMP=$VENV/.installed
PYTHON=${PYTHON:-python3}

if [[ ! -f $STAMP || $STAMP -ot scripts/sglang_env.sh ]]; then
  echo ">> creating $VENV (torch 2.14.1, sglang 0.5.23)"
  "$PYTHON" -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q torch==2.14.1 torchvision==0.29.1
  "$PY" -m pip install -q sglang==0.5.23 sglang-router==0.3.2 \
      pytest pytest-timeout pytest-asyncio hydra-core==1.3.2 "omegaconf>=2.3,<2.4"
  "$PY" -c "import sglang, torch; print('>> sglang', sglang.__version__, torch.__version__)"
  touch "$STAMP"
fi
[[ "${1:-}" == "--build-only" ]] && exit 0

echo ">> SGLang's parsers on the adapter's argument lists ($VENV)"
"$PY" -m pytest tests/sglang/test_server_args.py -p no:cacheprovider -p no:warnings "$@"

if [[ -x .venv/bin/python ]]; then
  echo ">> launch / attach / bench_serving against the bundled server (.venv)"
  .venv/bin/python -m pytest tests/sglang -p no:cacheprovider -rsx "$@"
else
  echo ">> .venv is absent: run 'make venv' for the main-environment SGLang tests"
fi
