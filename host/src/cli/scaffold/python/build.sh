#!/bin/sh
# Builds {name}.wasm from app.py against the vendored WIT package in wit/.
# componentize-py (the version in requirements.txt) must be on PATH: see README.md.
set -eu
cd "$(dirname "$0")"
componentize-py -d wit -w grader componentize app -o {name}.wasm
