#!/usr/bin/env bash
# Sets up (tools/setup.sh), then runs the main job: a training step of a GDN layer and a KDA layer
# (python -m cake.demo; on the GPU when there is one, else on the CPU). Its arguments go to the
# demo: bash tools/demo.sh --help explains them and the printed lines.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python -m cake.demo "$@"
