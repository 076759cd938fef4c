#!/usr/bin/env bash
# Installs everything the project needs into ./.venv. Idempotent: a second run is quick.
#
# torch: the CPU build (2.13.0+cpu). On this project's machines pip finds that wheel on local
# disk; a plain `torch` requirement would pull a multi-GB CUDA build instead. On a GPU host,
# install the torch build you want into .venv first and set RCP_KEEP_TORCH=1.
# Versions: infra/local/constraints.txt pins what the tests ran with, so pip does not
# backtrack through old releases.
#
# The dependencies are installed once per machine and dependency set, into a cache outside the
# clone: ${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/rcp}/venv-<key>, where <key> hashes the
# Python version, the machine, pyproject.toml's dependency lists, the pins and this script. A
# clone's .venv is a hard-linked copy of it (a second or two; .venv/.rcp-deps names the key it
# came from) with the project installed editable on top, so every clone on the machine reuses
# one install, and a change to what the venv depends on builds a new one (minutes). The cache
# is never written after it is complete (files a clone rewrites, its scripts' first lines, are
# replaced, not edited in place), and the three newest are kept. RCP_VENV_CACHE=0, or
# RCP_KEEP_TORCH=1, installs into .venv itself instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in python3.11 python3.12 python3.10 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PY="$candidate"; break; fi
  done
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1

# Debian packages, only their binaries used, started on loopback by `rcp up` and the tests,
# never as services: prometheus (the local Prometheus and the tests that scrape the cluster)
# and redis-server (the store of the head's GCS with ray.gcs_fault_tolerance, the default).
missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if [ "${#missing[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    echo "installing ${missing[*]} (Debian packages; their services are not started)"
    # policy-rc.d 101 keeps the packages from starting their services (Prometheus's would
    # listen on every interface); rcp up and the tests start the binaries on loopback.
    deny_start=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && deny_start=1
    fi
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null) \
      || echo "warning: could not install ${missing[*]}; without prometheus its tests skip, without redis-server rcp up needs ray.gcs_fault_tolerance=false"
    if [ "$deny_start" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
  else
    echo "warning: ${missing[*]} not installed and apt-get is not available as root; without prometheus its tests skip, without redis-server rcp up needs ray.gcs_fault_tolerance=false"
  fi
fi

# What the venv depends on: every requirement of pyproject.toml (with the dev and local
# extras), one a line, for `pip install -r`; and the cache key over it.
reqs=$(mktemp)
trap 'rm -f "$reqs"' EXIT
key=$("$PY" - "$reqs" <<'EOF'
import hashlib, json, platform, sys

try:
    import tomllib
except ImportError:  # Python 3.10: hash the whole file, read the lists with a minimal parser
    tomllib = None
with open("pyproject.toml", "rb") as f:
    raw = f.read()
if tomllib is not None:
    project = tomllib.loads(raw.decode())["project"]
    extras = project.get("optional-dependencies", {})
    wanted = [*project.get("dependencies", []), *extras.get("dev", []), *extras.get("local", [])]
    what = json.dumps([project.get("dependencies", []), extras], sort_keys=True).encode()
else:
    sys.exit("install.sh: Python 3.11 or newer is needed to read pyproject.toml (tomllib)")
with open(sys.argv[1], "w") as out:
    out.write("\n".join(wanted) + "\n")
h = hashlib.sha256(what)
h.update(f"{sys.version_info[:3]} {platform.machine()}".encode())
for path in ("infra/local/install.sh", "infra/local/constraints.txt"):
    with open(path, "rb") as f:
        h.update(f.read())
print(h.hexdigest()[:16])
EOF
)

install_deps() {  # $1: a venv; installs torch (CPU build) and every requirement into it
  local venv=$1
  if [ "${RCP_KEEP_TORCH:-0}" != "1" ] && ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    echo "installing torch (CPU build)"
    "$venv/bin/pip" install -q "torch==2.13.0+cpu" || "$venv/bin/pip" install -q "torch==2.13.0"
  fi
  "$venv/bin/pip" install -q -c infra/local/constraints.txt -r "$reqs"
}

if [ "${RCP_VENV_CACHE:-1}" = "0" ] || [ "${RCP_KEEP_TORCH:-0}" = "1" ]; then
  if [ ! -x .venv/bin/python ]; then
    echo "creating .venv with $PY"
    "$PY" -m venv .venv
  fi
  echo "installing the dependencies into .venv"
  install_deps .venv
  rm -f .venv/.rcp-deps
elif [ "$(cat .venv/.rcp-deps 2>/dev/null)" != "$key" ]; then
  cache_root="${RCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rcp}"
  cached="$cache_root/venv-$key"
  mkdir -p "$cache_root"
  exec 9>"$cached.lock"
  flock 9  # another clone building the same key: wait for it, then reuse its work
  if [ ! -e "$cached/.complete" ]; then
    rm -rf "$cached"
    echo "building the dependency cache $cached with $PY (once per machine and dependency set)"
    "$PY" -m venv "$cached"
    install_deps "$cached"
    touch "$cached/.complete"
    # Keep the three newest caches.
    ls -1dt "$cache_root"/venv-*/ 2>/dev/null | tail -n +4 | while read -r old; do
      rm -rf "$old" "${old%/}.lock"
    done
  fi
  echo "creating .venv from the dependency cache $cached"
  rm -rf .venv
  cp -al "$cached" .venv 2>/dev/null || { rm -rf .venv; cp -a "$cached" .venv; }
  flock -u 9
  exec 9>&-
  rm -f .venv/.complete
  # The scripts name their interpreter on their first line: point it at this .venv (sed -i
  # writes a new file, so the cache's copy is left as it is).
  for script in .venv/bin/*; do
    if [ -f "$script" ] && [ ! -L "$script" ] && head -c 2 "$script" | grep -q '^#!'; then
      if head -n 1 "$script" | grep -qF "$cached/"; then
        sed -i "1s|$cached/|$root/.venv/|" "$script"
      fi
    fi
  done
  sed -i "s|$cached|$root/.venv|g" .venv/bin/activate .venv/bin/activate.csh .venv/bin/activate.fish
  echo "$key" > .venv/.rcp-deps
fi
echo "installing the project (editable)"
.venv/bin/pip install -q --no-deps --no-build-isolation -e .
echo "installed: $(.venv/bin/python -c 'import ray, torch; print("ray", ray.__version__, "torch", torch.__version__)')"
