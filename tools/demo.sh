#!/usr/bin/env bash
# Sets up (tools/setup.sh), then runs the main job: python -m cake.train, which trains a small
# language model built from cake's layers on the Python standard library's source files (on the
# GPU when there is one, else on the CPU) and writes its loss curve and log. Its arguments go to
# cake.train: bash tools/demo.sh --help explains them and what it prints and writes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python -m cake.train "$@"
