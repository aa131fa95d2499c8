confine "$1"
p=$R/$1
max=$2
exists "$p" || fail not_found "$1 does not exist"
[ -d "$p" ] || fail invalid_input "$1 is not a directory"
# One expansion of the directory, kept as the positional parameters: building them
# up one `set --` at a time would copy the whole list per entry (quadratic).
set +f
set -- "$p"/* "$p"/.*
set -f
n=0
for f; do
  case ${f##*/} in .|..) continue ;; esac
  exists "$f" || continue
  n=$((n+1))
done
[ "$n" -eq 0 ] && exit 0
[ "$n" -gt "$max" ] && fail limit_exceeded "$1 holds $n entries, more than $max are listed"
for f; do
  case ${f##*/} in .|..) continue ;; esac
  exists "$f" || continue
  printf '%s\0' "${f##*/}"
done | base64
echo .
for f; do
  case ${f##*/} in .|..) continue ;; esac
  exists "$f" || continue
  printf '%s\0' "$f"
done | xargs -0 stat -c '%f %s' --
