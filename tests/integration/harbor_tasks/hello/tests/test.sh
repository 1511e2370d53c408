#!/bin/bash
# Reward 1 when the solution left its file, 0 otherwise.
if [ "$(cat /tmp/hello.txt 2>/dev/null)" = "hello" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
