confine_parent "$1"
confine_parent "$2"
f=$R/$1
t=$R/$2
exists "$f" || fail not_found "$1 does not exist"
d=${t%/*}
err=$(mkdir -p -- "${d:-/}" 2>&1) || fail invalid_input "a parent of $2 is not a directory: $err"
if [ -L "$t" ]; then
  rm -f -- "$t"
elif [ -d "$t" ]; then
  if [ -d "$f" ] && [ ! -L "$f" ]; then
    rmdir -- "$t" 2>/dev/null || fail already_exists "$2 is a directory that is not empty"
  else
    fail invalid_input "$2 is a directory"
  fi
fi
err=$(mv -f -- "$f" "$t" 2>&1) || fail invalid_input "$err"
exit 0
