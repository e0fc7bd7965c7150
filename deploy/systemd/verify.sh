#!/bin/sh
# Checks the unit files in this directory with `systemd-analyze verify`
# (Debian: apt-get install -y systemd). It runs against a scratch root so
# that nothing needs installing: verify insists that ExecStart's binary
# exists, so the root gets /usr/local/bin/infera (the binary given as $1, or
# a stub) and a copy of the system's own units (verify loads the targets the
# units hang off). verify exits 0 on many findings ("Unknown key ..."), so any
# output at all is a failure.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT INT TERM

mkdir -p "$root/usr/local/bin" "$root/usr/lib/systemd" "$root/etc/systemd/system"
if [ "${1:-}" ]; then
	cp "$1" "$root/usr/local/bin/infera"
else
	printf '#!/bin/sh\nexit 0\n' >"$root/usr/local/bin/infera"
fi
chmod 0755 "$root/usr/local/bin/infera"
cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
cp "$here"/*.service "$root/etc/systemd/system/"

units=""
for f in "$here"/*.service; do
	name=$(basename "$f")
	case "$name" in
	*@.service) name="${name%@.service}@gpu0.service" ;; # a template is verified through an instance
	esac
	units="$units $name"
done

# shellcheck disable=SC2086 # one argument per unit
if ! out=$(systemd-analyze verify --root="$root" $units 2>&1); then
	printf '%s\n' "$out"
	exit 1
fi
if [ -n "$out" ]; then
	printf '%s\n' "$out"
	exit 1
fi
echo "systemd-analyze verify: ok:$units"
