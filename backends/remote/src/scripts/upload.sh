if [ "$2" = first ]; then
  t=${TMPDIR:-/tmp}/$1
  (set -C; : > "$t") 2>/dev/null || fail backend "cannot create $t"
  printf '%s\n' "$t"
else
  t=$1
  [ -f "$t" ] || fail not_found "the upload $t is gone"
fi
base64 -d >> "$t" || { rm -f -- "$t"; fail backend "writing $t failed"; }
