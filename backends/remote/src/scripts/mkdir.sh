confine "$1"
p=$R/$1
[ -d "$p" ] && exit 0
exists "$p" && fail already_exists "$1 exists and is not a directory"
err=$(mkdir -p -- "$p" 2>&1) || fail already_exists "a file is in the way of $1: $err"
exit 0
