# shellcheck shell=sh
marker=$1; dir=$2; n=$3; shift 3
fail() { printf '%s:%s:%s\n' "$marker" "$1" "$2" >&2; exit 90; }
if [ -n "$dir" ]; then cd -- "$dir" 2>/dev/null || fail not_found "the working directory $dir does not exist"; fi
# Each word is NAME=value, exported as it is (SC2163).
# shellcheck disable=SC2163
while [ "$n" -gt 0 ]; do export "$1"; shift; n=$((n - 1)); done
command -v -- "$1" >/dev/null 2>&1 || fail not_found "$1 is not on the sandbox's PATH"
exec "$@"
