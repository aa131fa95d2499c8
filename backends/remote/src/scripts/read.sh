confine "$1"
p=$R/$1
exists "$p" || fail not_found "$1 does not exist"
[ -d "$p" ] && fail invalid_input "$1 is a directory"
[ -r "$p" ] || fail permission_denied "$1 is not readable"
stat -L -c %s -- "$p" || exit 1
dd if="$p" bs=65536 skip="$2" count="$3" 2>/dev/null | base64
