confine "$1"
p=$R/$1
if [ -L "$p" ]; then p=$(readlink -f -- "$p") || fail permission_denied "$1 cannot be resolved"; fi
[ -d "$p" ] && fail invalid_input "$1 is a directory"
d=${p%/*}
[ -n "$d" ] || d=/
t=$d/$2
if [ "$3" = first ]; then
  err=$(mkdir -p -- "$d" 2>&1) || fail invalid_input "a parent of $1 is not a directory: $err"
  (set -C; : > "$t") 2>/dev/null || fail backend "cannot create a temporary file beside $1"
else
  [ -f "$t" ] || fail not_found "the upload of $1 is gone"
fi
base64 -d >> "$t" || { rm -f -- "$t"; fail backend "writing $1 failed"; }
if [ "$4" = last ]; then
  err=$(mv -f -- "$t" "$p" 2>&1) || { rm -f -- "$t"; fail backend "replacing $1: $err"; }
fi
exit 0
