#!/usr/bin/env bash
# Install the official Node SDKs the e2e SDK tests drive (openai,
# @anthropic-ai/sdk), at the versions pinned in e2e/sdk/package.json, into
# DEST (default .run/sdk, gitignored): DEST/node_modules.
# Idempotent: nothing is fetched when the pinned versions are installed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$root/.run/sdk}"
pkg="$root/e2e/sdk/package.json"
command -v node >/dev/null || { echo "install-sdks: node not found" >&2; exit 1; }
command -v npm >/dev/null || { echo "install-sdks: npm not found" >&2; exit 1; }
mkdir -p "$dest"
installed() {
  node -e '
    const want = require(process.argv[1]).dependencies;
    for (const [name, v] of Object.entries(want)) {
      const got = require(process.argv[2] + "/node_modules/" + name + "/package.json").version;
      if (got !== v) process.exit(1);
    }' "$pkg" "$dest" 2>/dev/null
}
if installed && cmp -s "$pkg" "$dest/package.json"; then
  echo "install-sdks: pinned SDKs up to date in $dest"
  exit 0
fi
cp "$pkg" "$dest/package.json"
(cd "$dest" && npm install --no-audit --no-fund --no-package-lock --silent)
installed || { echo "install-sdks: installed versions differ from $pkg" >&2; exit 1; }
echo "install-sdks: SDKs installed in $dest"
