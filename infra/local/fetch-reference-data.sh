#!/usr/bin/env bash
# Downloads the upstream reference data the tests validate against (KubeRay's CRDs,
# dcgm-exporter's default counter list) into the cache tests/reference_data.py reads:
#   ${RCP_REFERENCE_DATA_DIR:-${XDG_CACHE_HOME:-~/.cache}/rcp/reference-data}
# What to download is tests/reference_data.lock: per file its sha256, its path in the cache,
# and its URL at a full upstream commit. Every file is downloaded into a temporary directory
# and its sha256 checked; only when all match are they moved into the cache, so a failed or
# tampered download writes nothing there. When the cache already holds every file with its
# pinned hash, nothing is downloaded.
# RCP_REFERENCE_DATA_BASE_URL, when set, takes the place of https://raw.githubusercontent.com
# in every URL (a mirror; the unit tests serve files from a loopback server or file://).
# Exit 0: the cache holds every file. Exit 1: nothing written, and one line on stderr says
# why (the network is not reachable, a download failed, a file's hash does not match).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
lock="$root/tests/reference_data.lock"
cache="${RCP_REFERENCE_DATA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rcp/reference-data}"
upstream=https://raw.githubusercontent.com
base="${RCP_REFERENCE_DATA_BASE_URL:-$upstream}"
base="${base%/}"

die() {
  echo "fetch-reference-data: $*" >&2
  exit 1
}

command -v curl >/dev/null || die "curl is not installed; it is needed to download"
if command -v sha256sum >/dev/null; then
  sha256() { sha256sum "$1" | cut -d' ' -f1; }
elif command -v shasum >/dev/null; then
  sha256() { shasum -a 256 "$1" | cut -d' ' -f1; }
else
  die "neither sha256sum nor shasum is installed; one is needed to check the files"
fi

hashes=()
paths=()
urls=()
while read -r hash path url || [[ -n "$hash" ]]; do
  [[ -z "$hash" || "$hash" == \#* ]] && continue
  [[ "$path" == /* || "$path" == *..* ]] && die "$lock: path $path leaves the cache"
  [[ "$url" == "$upstream"/* ]] || die "$lock: $url is not under $upstream"
  hashes+=("$hash")
  paths+=("$path")
  urls+=("$base${url#"$upstream"}")
done <"$lock"
[[ ${#paths[@]} -gt 0 ]] || die "$lock lists no file"

present=0
for i in "${!paths[@]}"; do
  file="$cache/${paths[$i]}"
  if [[ -f "$file" && "$(sha256 "$file")" == "${hashes[$i]}" ]]; then
    present=$((present + 1))
  fi
done
if [[ $present -eq ${#paths[@]} ]]; then
  echo "reference data: all $present files already in $cache (sha256 checked)"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. Download every file; the first failure ends the run.
for i in "${!paths[@]}"; do
  url="${urls[$i]}"
  rc=0
  err=$(curl -fsS --location --connect-timeout 15 --max-time 300 -o "$tmp/$i" "$url" 2>&1) || rc=$?
  if [[ $rc -ne 0 ]]; then
    host="${url#*://}"
    host="${host%%/*}"
    reason="${err#curl: }"
    case $rc in
      5 | 6 | 7 | 28 | 35 | 56)
        die "network not reachable: cannot download from ${host:-$url} (curl: $reason); nothing written"
        ;;
      *) die "download failed: $url (curl: $reason); nothing written" ;;
    esac
  fi
done

# 2. Check every file before any is written.
for i in "${!paths[@]}"; do
  got=$(sha256 "$tmp/$i")
  if [[ "$got" != "${hashes[$i]}" ]]; then
    die "refused: ${paths[$i]} from ${urls[$i]} has sha256 $got, not the pinned ${hashes[$i]}; nothing written"
  fi
done

# 3. Move them in; each lands by a rename within its own directory.
for i in "${!paths[@]}"; do
  dest="$cache/${paths[$i]}"
  mkdir -p "$(dirname "$dest")"
  cp "$tmp/$i" "$dest.partial.$$"
  mv -f "$dest.partial.$$" "$dest"
done
echo "reference data: wrote ${#paths[@]} files to $cache (sha256 checked)"
