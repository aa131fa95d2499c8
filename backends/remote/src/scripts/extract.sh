trap 'rm -f -- "$2"' EXIT
confine "$1"
p=$R/$1
if exists "$p"; then
  [ -d "$p" ] || fail invalid_input "$1 is not a directory"
  if [ -L "$p" ]; then p=$(readlink -f -- "$p") || fail permission_denied "$1 cannot be resolved"; fi
fi
if [ "$3" = merge ]; then
  err=$(mkdir -p -- "$p" 2>&1) || fail invalid_input "$err"
  err=$(tar -x -o -f "$2" -C "$p" 2>&1) || fail backend "unpacking: $err"
  exit 0
fi
if [ -z "$1" ]; then
  s=$R/$4
  mkdir -- "$s" || fail backend "cannot create $s"
  err=$(tar -x -o -f "$2" -C "$s" 2>&1) || { rm -rf -- "$s"; fail backend "unpacking: $err"; }
  set +f
  for f in "$R"/* "$R"/.*; do
    case ${f##*/} in .|..|"$4") continue ;; esac
    exists "$f" || continue
    rm -rf -- "$f" || fail backend "cannot remove $f"
  done
  for f in "$s"/* "$s"/.*; do
    case ${f##*/} in .|..) continue ;; esac
    exists "$f" || continue
    mv -- "$f" "$R/" || fail backend "cannot move $f"
  done
  rmdir -- "$s"
  exit 0
fi
d=${p%/*}
err=$(mkdir -p -- "${d:-/}" 2>&1) || fail invalid_input "$err"
s=$d/$4
mkdir -- "$s" || fail backend "cannot create $s"
err=$(tar -x -o -f "$2" -C "$s" 2>&1) || { rm -rf -- "$s"; fail backend "unpacking: $err"; }
if [ -d "$p" ]; then
  mv -- "$p" "$s.old" || { rm -rf -- "$s"; fail backend "cannot move $1 aside"; }
  mv -- "$s" "$p" || { mv -- "$s.old" "$p"; rm -rf -- "$s"; fail backend "cannot move the import into $1"; }
  rm -rf -- "$s.old"
else
  mv -- "$s" "$p" || { rm -rf -- "$s"; fail backend "cannot move the import into $1"; }
fi
exit 0
