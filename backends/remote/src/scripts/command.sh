# shellcheck shell=sh
marker=$1; dir=$2; stdin=$3; n=$4; shift 4
fail() { printf '%s:%s:%s\n' "$marker" "$1" "$2" >&2; exit 90; }
# Binary stdin arrives as base64 text (the API carries text): decoded into a file that
# is unlinked once open, so nothing is left behind and the command still replaces
# this shell.
if [ "$stdin" = base64 ]; then
  staged=$(mktemp) || fail backend "cannot stage stdin: mktemp failed"
  base64 -d >"$staged" || { rm -f -- "$staged"; fail invalid_input "stdin did not decode"; }
  exec <"$staged"
  rm -f -- "$staged"
fi
if [ -n "$dir" ]; then cd -- "$dir" 2>/dev/null || fail not_found "the working directory $dir does not exist"; fi
# Each word is NAME=value, exported as it is (SC2163).
# shellcheck disable=SC2163
while [ "$n" -gt 0 ]; do export "$1"; shift; n=$((n - 1)); done
command -v -- "$1" >/dev/null 2>&1 || fail not_found "$1 is not on the sandbox's PATH"
exec "$@"
