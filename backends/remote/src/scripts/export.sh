confine "$1"
p=$R/$1
exists "$p" || fail not_found "$1 does not exist"
[ -d "$p" ] || fail invalid_input "$1 is not a directory"
t=${TMPDIR:-/tmp}/$2
(set -C; : > "$t") 2>/dev/null || fail backend "cannot create $t"
err=$(tar -cf "$t" -C "$p" . 2>&1) || { rm -f -- "$t"; fail backend "tar: $err"; }
size=$(stat -c %s -- "$t") || { rm -f -- "$t"; exit 1; }
printf '%s\n%s\n' "$t" "$size"
dd if="$t" bs=65536 skip="$3" count="$4" 2>/dev/null | base64
[ "$size" -le $(($4 * 65536)) ] && rm -f -- "$t"
exit 0
