#!/usr/bin/env bash
# Writes data/kjv.txt: the King James Bible (public domain) as plain text, one verse per line, from the
# Debian package bible-kjv (installed with apt-get when missing; needs root for that). Idempotent: an
# existing, complete data/kjv.txt is kept.
set -euo pipefail

cd "$(dirname "$0")/.."
out=data/kjv.txt
# The whole KJV is 31,102 verses; a shorter file is a broken earlier attempt.
expected_lines=31102

if [[ -f "$out" ]] && [[ "$(wc -l < "$out")" -eq "$expected_lines" ]]; then
  echo "get_data: $out is already there ($(wc -c < "$out") bytes)"
  exit 0
fi

if ! command -v bible > /dev/null 2>&1; then
  if [[ "$(id -u)" -ne 0 ]]; then
    echo "get_data: the 'bible' program (Debian package bible-kjv) is missing; run as root or: apt-get install bible-kjv" >&2
    exit 1
  fi
  echo "get_data: installing bible-kjv"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q bible-kjv > /dev/null \
    || { apt-get update -q > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bible-kjv > /dev/null; }
fi

mkdir -p data
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
# `bible -f` prints "Ge1:1 In the beginning ..." one verse per line when stdout is not a terminal; the
# verse reference is stripped so the text is plain English.
bible -f gen1:1-rev22:21 < /dev/null | sed -E 's/^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ //' > "$tmp"
lines="$(wc -l < "$tmp")"
if [[ "$lines" -ne "$expected_lines" ]]; then
  echo "get_data: expected $expected_lines verses from 'bible -f gen1:1-rev22:21', got $lines" >&2
  exit 1
fi
mv "$tmp" "$out"
echo "get_data: wrote $out ($(wc -c < "$out") bytes, $lines verses)"
