#!/bin/bash
set -eu
sed -i 's/^state=broken$/state=fixed/' /app/data/config.txt
echo "fixed by $(id -un)" > /etc/task-done.conf
useradd solver
python3 /app/src/main.py > /app/out.txt
echo "solved as $(id -u) in $(pwd)"
