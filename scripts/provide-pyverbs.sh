#!/bin/sh
# Make Debian's pyverbs importable inside a venv, touching nothing outside it.
#
#   scripts/provide-pyverbs.sh .venv
#
# PyPI's "pyverbs" does not match Debian 12's libibverbs; Debian's python3-pyverbs
# (rdma-core 44) does. We fetch that .deb with `apt-get download` (no root needed),
# unpack it under the venv and point a .pth file at it. Anything missing (no apt,
# no package, no libibverbs, another Python ABI) leaves the venv as it was: the
# tests that need pyverbs then skip and say why. Best effort: always exits 0.
set -u
VENV=${1:-.venv}
PY="$VENV/bin/python"
"$PY" -c "import pyverbs.device" 2>/dev/null && { echo "pyverbs: already importable"; exit 0; }
command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 ||
    { echo "pyverbs: no apt-get/dpkg-deb here; the pyverbs adapter tests will skip"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$tmp" && apt-get download python3-pyverbs >/dev/null 2>&1); then
    echo "pyverbs: 'apt-get download python3-pyverbs' failed; the pyverbs adapter tests will skip"
    exit 0
fi
dest="$VENV/pyverbs-debian"
rm -rf "$dest" && mkdir -p "$dest" && dpkg-deb -x "$tmp"/python3-pyverbs_*.deb "$dest" || exit 0
site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$(cd "$dest" && pwd)/usr/lib/python3/dist-packages" > "$site/debian-pyverbs.pth"
if why=$("$PY" -c "import pyverbs.device" 2>&1); then
    echo "pyverbs: Debian's python3-pyverbs unpacked into $dest"
else
    rm -f "$site/debian-pyverbs.pth"
    echo "pyverbs: unpacked but not importable here ($(echo "$why" | tail -n 1)); the adapter tests will skip"
fi
exit 0
