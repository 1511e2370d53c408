#!/bin/bash
# Reward 1 when the solution changed the image's files in place, as root, and the image is
# the one the Dockerfile describes; 0 otherwise (each failed check is printed).
ok=1
check() { if ! eval "$1"; then echo "FAILED: $1"; ok=0; fi; }
check '[ "$(cat /app/data/config.txt)" = "state=fixed" ]'
check '[ "$(cat /etc/task-done.conf)" = "fixed by root" ]'
check 'id solver >/dev/null 2>&1'
check '[ "$(cat /app/out.txt)" = "answer 42" ]'
check '[ "$(cat /app/notes.txt)" = "copied notes" ]'
check '[ "$(cat /home/builder/who.txt)" = "built by builder" ]'
check '[ "$(stat -c %U /home/builder/who.txt)" = builder ]'
check '[ "$(hello)" = tool-ok ]'
check '[ "$TASK_MODE" = strict ]'
echo $ok > /logs/verifier/reward.txt
