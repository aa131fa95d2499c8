confine_parent "$1"
p=$R/$1
exists "$p" || fail not_found "$1 does not exist"
if [ -d "$p" ] && [ ! -L "$p" ]; then
  if [ "$2" = recursive ]; then
    err=$(rm -rf -- "$p" 2>&1) || fail permission_denied "$err"
  else
    rmdir -- "$p" 2>/dev/null || fail invalid_input "$1 is a directory that is not empty"
  fi
else
  err=$(rm -f -- "$p" 2>&1) || fail permission_denied "$err"
fi
exit 0
