confine_parent "$1"
p=$R/$1
exists "$p" || fail not_found "$1 does not exist"
stat -c '%f %s %Y' -- "$p" || exit 1
if [ -L "$p" ]; then readlink -- "$p" | base64; fi
exit 0
