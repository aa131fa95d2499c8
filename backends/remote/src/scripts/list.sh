confine "$1"
p=$R/$1
exists "$p" || fail not_found "$1 does not exist"
[ -d "$p" ] || fail invalid_input "$1 is not a directory"
set +f
set --
for f in "$p"/* "$p"/.*; do
  case ${f##*/} in .|..) continue ;; esac
  exists "$f" || continue
  set -- "$@" "$f"
done
set -f
[ $# -eq 0 ] && exit 0
for f; do printf '%s\0' "${f##*/}"; done | base64
echo .
for f; do printf '%s\0' "$f"; done | xargs -0 stat -c '%f %s' --
