confine "$1"
p=$R/$1
[ -d "$p" ] || exit 0
cd -- "$p" && find . -type l -print0 | base64
