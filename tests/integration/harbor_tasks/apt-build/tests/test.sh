#!/bin/bash
# Reward 1 when the package the image installed works and the downloaded file is there as
# Docker leaves one (mode 0600, root's); 0 otherwise (each failed check is printed).
ok=1
check() { if ! eval "$1"; then echo "FAILED: $1"; ok=0; fi; }
check '[ "$(cat /app/answer.txt)" = "tinytool 1.0 works" ]'
check 'dpkg -s tinytool | grep -q "^Status: install ok installed"'
check '[ "$(stat -c "%a %u" /app/fetched.txt)" = "600 0" ]'
check '[ "$(cat /etc/fetched.conf)" = "fetched from the package server" ]'
echo $ok > /logs/verifier/reward.txt
