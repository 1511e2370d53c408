#!/usr/bin/env bash
# The headless browser the review console's tests drive (tests/integration/
# test_review_browser.py): Debian's chromium and its chromedriver, from the host's own apt
# sources. Nothing is downloaded at test time.
set -euo pipefail
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
[ ${#need[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-browser: missing ${need[*]} and no apt-get to install them" >&2
  exit 1
fi
echo "ensure-browser: installing ${need[*]}"
as_root apt-get update -qq
as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
