[ -f "$1" ] || fail not_found "the temporary file $1 is gone"
dd if="$1" bs=65536 skip="$2" count="$3" 2>/dev/null | base64
[ "$4" = remove ] && rm -f -- "$1"
exit 0
