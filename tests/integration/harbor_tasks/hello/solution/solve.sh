#!/bin/bash
set -eu
echo hello > /tmp/hello.txt
echo "solved as $(id -u) in $(pwd)"
# A zone given with --mounts-json, when there is one.
echo "zone: $(cat /code/word.txt 2>/dev/null || echo none)"
