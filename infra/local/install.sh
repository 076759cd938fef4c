#!/usr/bin/env bash
# Installs everything the project needs into ./.venv. Idempotent: a second run is quick.
#
# torch: the CPU build (2.13.0+cpu). On this project's machines pip finds that wheel on local
# disk; a plain `torch` requirement would pull a multi-GB CUDA build instead. On a GPU host,
# install the torch build you want first and set RCP_KEEP_TORCH=1.
# Versions: infra/local/constraints.txt pins what the tests ran with, so pip does not
# backtrack through old releases.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in python3.11 python3.12 python3.10 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PY="$candidate"; break; fi
  done
fi
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $PY"
  "$PY" -m venv .venv
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ "${RCP_KEEP_TORCH:-0}" != "1" ] && ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "installing torch (CPU build)"
  .venv/bin/pip install -q "torch==2.13.0+cpu" || .venv/bin/pip install -q "torch==2.13.0"
fi
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
echo "installing the project and its dependencies"
.venv/bin/pip install -q -c infra/local/constraints.txt -e ".[dev]"
echo "installed: $(.venv/bin/python -c 'import ray, torch; print("ray", ray.__version__, "torch", torch.__version__)')"
